"""The FAQ record: the unit every collection loader produces and every index stores."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

NOT_IN_ID = re.compile(r"[\s\x00-\x1f\x7f-\x9f]+")
"""Whitespace and control characters: never part of an id."""


@dataclass
class FaqRecord:
    """One FAQ. `id` is unique within a collection; `answer` may be empty (e.g. MedQuAD rows with removed answers)."""

    id: str
    question: str
    answer: str = ""
    source: str = ""
    url: str = ""
    updated: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> FaqRecord:
        return cls(
            id=str(row["id"]),
            question=row["question"],
            answer=row.get("answer") or "",
            source=row.get("source") or "",
            url=row.get("url") or "",
            updated=row.get("updated") or "",
            metadata=dict(row.get("metadata") or {}),
        )


def id_problem(value: str) -> str | None:
    """Why `value` cannot be an FAQ or query id, or None. Ids are non-empty and hold no whitespace or control
    character: TREC run files separate their columns by whitespace, so such an id would break every run."""
    if not value:
        return "is empty"
    if NOT_IN_ID.search(value):
        return "holds whitespace or a control character (TREC runs cannot carry it)"
    return None


def record_problem(record: FaqRecord) -> str | None:
    """Why `record` cannot be indexed (a bad id, a blank question), or None: the one rule for files and the API."""
    problem = id_problem(record.id)
    if problem:
        return f"FAQ id {record.id!r} {problem}"
    if not record.question.strip():
        return f"FAQ {record.id!r} has an empty question"
    return None


def safe_id(value: str) -> str:
    """`value` with each run of whitespace or control characters replaced by ``_``: how the converters of known
    datasets whose ids hold spaces (the JHU FAQ bank) make them valid ids."""
    return NOT_IN_ID.sub("_", value.strip())


FIELDS = ("question", "question+answer")
"""What text of a record an index embeds and BM25-indexes."""


def record_text(record: FaqRecord, fields: str) -> str:
    """The text that is embedded and BM25-indexed for `record`."""
    if fields == "question+answer" and record.answer:
        return f"{record.question} {record.answer}"
    return record.question
