"""The FAQ record: the unit every collection loader produces and every index stores."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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


FIELDS = ("question", "question+answer")
"""What text of a record an index embeds and BM25-indexes."""


def record_text(record: FaqRecord, fields: str) -> str:
    """The text that is embedded and BM25-indexed for `record`."""
    if fields == "question+answer" and record.answer:
        return f"{record.question} {record.answer}"
    return record.question
