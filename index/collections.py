"""FAQ collection loaders: generic JSONL/CSV (with a field mapping), MedQuAD, the Quebec COVID FAQ and the JHU FAQ bank.

Every loader yields :class:`~index.records.FaqRecord` objects and a :class:`LoadReport` that counts what was
skipped. Bad input becomes one-line :class:`~common.runtime.MedfaqError` messages that name the file and line.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from medfaq.common.runtime import MedfaqError
from medfaq.index.records import FaqRecord, id_problem, record_problem, safe_id

logger = logging.getLogger("medfaq.collections")

FORMATS = ("auto", "jsonl", "csv", "medquad", "quebec", "jhu")
SCHEMA_FIELDS = tuple(f.name for f in fields(FaqRecord))
REQUIRED_FIELDS = ("id", "question")
MEDQUAD_METADATA = (
    "qtype",
    "focus",
    "focus_category",
    "collection",
    "doc_id",
    "pid",
    "qid_original",
    "cuis",
    "semantic_types",
    "semantic_group",
    "synonyms",
    "answer_removed",
)
JHU_METADATA = ("language", "type_of_info", "topic", "target_location", "has_answer", "file")


@dataclass
class LoadReport:
    """What a loader read and skipped; `summary()` is the line the CLI prints."""

    path: str
    format: str
    loaded: int = 0
    skipped_empty: int = 0
    skipped_bad: int = 0
    skipped_other: int = 0
    bad_lines: list[int] = field(default_factory=list)

    def summary(self) -> str:
        return "; ".join([f"{self.loaded} FAQs from {self.path} ({self.format})", *self.skips()])

    def skips(self) -> list[str]:
        """What was skipped, one phrase per kind (empty when nothing was)."""
        parts = []
        if self.skipped_empty:
            parts.append(f"{self.skipped_empty} with an empty question skipped")
        if self.skipped_bad:
            parts.append(f"{self.skipped_bad} malformed lines skipped (first: {self.bad_lines[:5]})")
        if self.skipped_other:
            parts.append(f"{self.skipped_other} non-FAQ rows skipped")
        return parts


def parse_field_map(items: list[str] | None) -> dict[str, str]:
    """Parse ``["question=title", "id=qid"]`` into ``{"question": "title", "id": "qid"}`` (schema <- source)."""
    mapping: dict[str, str] = {}
    for item in items or []:
        target, sep, source = item.partition("=")
        target, source = target.strip(), source.strip()
        if not sep or not target or not source:
            raise MedfaqError(f"bad field mapping {item!r}: expected SCHEMA_FIELD=SOURCE_FIELD, e.g. question=title")
        if target not in SCHEMA_FIELDS:
            raise MedfaqError(
                f"unknown field name {target!r} in mapping {item!r}; schema fields: {', '.join(SCHEMA_FIELDS)}"
            )
        mapping[target] = source
    return mapping


def detect_format(path: Path) -> str:
    """Guess the format from the file suffix and the keys of the first JSON line."""
    if path.suffix.lower() in {".csv", ".tsv"}:
        return "csv"
    first = next(
        (line for _, line in _read_lines(path, LoadReport(str(path), "auto"), True) if line and line.strip()), ""
    )
    try:
        keys = set(json.loads(first)) if first else set()
    except (json.JSONDecodeError, TypeError):
        return "jsonl"  # the JSONL loader reports the malformed line with its number
    if {"qtype", "focus", "question"} <= keys:
        return "medquad"
    if {"passage_id", "faq_question"} <= keys:
        return "quebec"
    if {"source_name", "type_of_info", "question"} <= keys:
        return "jhu"
    return "jsonl"


def resolve_collection_path(collection: str | Path) -> Path:
    """A collection argument: an existing file, a directory holding one known collection file, or a dataset name."""
    path = Path(collection).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        candidates = [p for p in (path / "medquad.jsonl", path / "faqs.jsonl") if p.is_file()]
        if len(candidates) == 1:
            return candidates[0]
        raise MedfaqError(f"{path} is a directory; pass the collection file (e.g. {path}/faqs.jsonl)")
    from medfaq.index.datasets import DATASETS, dataset_collection_path

    if str(collection) in DATASETS:
        return dataset_collection_path(str(collection))
    raise MedfaqError(f"collection not found: {collection} (a file, or a fetched dataset name: medfaq data list)")


def load_collection(
    collection: str | Path,
    format: str = "auto",
    field_map: dict[str, str] | None = None,
    skip_bad: bool = False,
) -> tuple[list[FaqRecord], LoadReport]:
    """Load FAQ records from a file in one of :data:`FORMATS`.

    `field_map` (schema field -> source column) applies to the generic ``jsonl``/``csv`` formats; source columns
    that are not schema fields go into `metadata`. Malformed lines raise an error with their number unless
    `skip_bad`; empty questions are skipped and counted; duplicate ids raise an error naming them.
    """
    if format not in FORMATS:
        raise MedfaqError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    path = resolve_collection_path(collection)
    if format == "auto":
        format = detect_format(path)
    if field_map and format not in {"jsonl", "csv"}:
        raise MedfaqError(f"field mappings apply to the jsonl and csv formats, not {format}")
    report = LoadReport(path=str(path), format=format)
    if format == "csv":
        rows = _csv_rows(path, report, skip_bad)
    else:
        rows = iter_jsonl(path, report, skip_bad)
    convert = _CONVERTERS[format]
    records: list[FaqRecord] = []
    for line_no, row in rows:
        try:
            record = convert(row, field_map or {}) if format in {"jsonl", "csv"} else convert(row)
        except _BadRow as error:
            _bad_line(report, path, line_no, str(error), skip_bad)
            continue
        if record is None:
            report.skipped_other += 1
        elif not record.question.strip():
            report.skipped_empty += 1
        elif id_problem(record.id):
            _bad_line(report, path, line_no, f"FAQ id {record.id!r} {id_problem(record.id)}", skip_bad)
        else:
            records.append(record)
    check_unique_ids(records, path)
    report.loaded = len(records)
    logger.info(report.summary())
    return records, report


def check_records(records: list[FaqRecord], where: str | Path) -> None:
    """Raise a one-line error naming the first record that cannot be indexed (:func:`record_problem`) or the
    duplicate ids (the first few)."""
    problems = [problem for problem in map(record_problem, records) if problem]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise MedfaqError(f"{where}: {problems[0]}{more}")
    check_unique_ids(records, where)


def check_unique_ids(records: list[FaqRecord], where: str | Path) -> None:
    """Raise a one-line error naming duplicate ids (the first few)."""
    counts = Counter(record.id for record in records)
    duplicates = [key for key, count in counts.items() if count > 1]
    if duplicates:
        shown = ", ".join(repr(d) for d in duplicates[:5])
        more = f" and {len(duplicates) - 5} more" if len(duplicates) > 5 else ""
        raise MedfaqError(f"duplicate FAQ ids in {where}: {shown}{more}")


class _BadRow(ValueError):
    """A row that cannot become a record (missing required field, wrong type)."""


def _bad_line(report: LoadReport, path: Path, line_no: int, reason: str, skip_bad: bool) -> None:
    if not skip_bad:
        raise MedfaqError(f"{path}:{line_no}: {reason} (use --skip-bad to skip such lines)")
    report.skipped_bad += 1
    report.bad_lines.append(line_no)


def _read_lines(path: Path, report: LoadReport, skip_bad: bool) -> Iterator[tuple[int, str | None]]:
    """Yield (line number, decoded line); a line that is not UTF-8 is an error naming the line and column, or with
    `skip_bad` a counted bad line, yielded as None."""
    try:
        handle = path.open("rb")
    except OSError as error:
        raise MedfaqError(f"cannot read {path}: {error.strerror}") from None
    with handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                yield line_no, raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as error:
                reason = f"not UTF-8 (byte 0x{raw[error.start]:02x} at column {error.start + 1}; re-encode the file)"
                _bad_line(report, path, line_no, reason, skip_bad)
                yield line_no, None


def iter_jsonl(
    path: Path, report: LoadReport | None = None, skip_bad: bool = False
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, JSON object) of a JSONL file; bad lines raise one-line errors, or are counted in
    `report` with `skip_bad`. Blank lines are ignored."""
    path = Path(path)
    if not path.is_file():
        raise MedfaqError(f"file not found: {path}")
    report = report or LoadReport(str(path), "jsonl")
    for line_no, line in _read_lines(path, report, skip_bad):
        if line is None or not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            _bad_line(report, path, line_no, f"malformed JSON ({error.msg} at column {error.colno})", skip_bad)
            continue
        if not isinstance(row, dict):
            _bad_line(report, path, line_no, "expected a JSON object", skip_bad)
            continue
        surrogate = _lone_surrogate(line, row)
        if surrogate:
            _bad_line(report, path, line_no, surrogate, skip_bad)
            continue
        yield line_no, row


def _lone_surrogate(line: str, row: dict[str, Any]) -> str:
    """Why `row` is not valid UTF-8 text (a JSON escape such as ``\\udce9`` that decodes to a lone surrogate), or ""."""
    if "\\ud" not in line.lower():  # surrogates only come from such escapes
        return ""
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        column = line.lower().find("\\ud") + 1
        return f"invalid UTF-8 (a lone surrogate escape such as \\udce9 near column {column})"
    return ""


def _csv_rows(path: Path, report: LoadReport, skip_bad: bool) -> Iterator[tuple[int, dict[str, Any]]]:
    text = "".join("\n" if line is None else line for _, line in _read_lines(path, report, skip_bad))
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    if not reader.fieldnames:
        raise MedfaqError(f"{path}: empty CSV file (expected a header line)")
    repeated = sorted({name for name in reader.fieldnames if reader.fieldnames.count(name) > 1})
    if repeated:  # a row would keep only the last of the cells under one name
        raise MedfaqError(f"{path}: the header names the column(s) {', '.join(map(repr, repeated))} more than once")
    for row in reader:
        if None in row:  # more cells than header columns
            _bad_line(report, path, reader.line_num, "more cells than header columns", skip_bad)
            continue
        yield reader.line_num, row


def _generic(row: dict[str, Any], field_map: dict[str, str]) -> FaqRecord:
    missing_sources = [source for source in field_map.values() if source not in row]
    if missing_sources:
        raise MedfaqError(
            f"unknown field name(s) {', '.join(map(repr, missing_sources))} in --field mapping; "
            f"the file has: {', '.join(sorted(row))}"
        )
    source_of = {name: field_map.get(name, name) for name in SCHEMA_FIELDS}
    absent = [name for name in REQUIRED_FIELDS if row.get(source_of[name]) is None]
    if absent:
        hint = " (map it with --field id=COLUMN)" if "id" in absent else ""
        raise _BadRow(f"missing required field(s) {', '.join(absent)}{hint}")
    values = {name: row[source] for name, source in source_of.items() if name != "metadata" and source in row}
    metadata = row.get(source_of["metadata"]) or {}
    if not isinstance(metadata, dict):
        raise _BadRow("'metadata' must be a JSON object")
    used = set(source_of.values())
    metadata = {**metadata, **{key: value for key, value in row.items() if key not in used}}
    try:
        return FaqRecord(
            id=_text(values["id"]),
            question=_text(values["question"]),
            answer=_text(values.get("answer")),
            source=_text(values.get("source")),
            url=_text(values.get("url")),
            updated=_text(values.get("updated")),
            metadata=metadata,
        )
    except TypeError as error:
        raise _BadRow(str(error)) from None


def _medquad(row: dict[str, Any]) -> FaqRecord:
    if "id" not in row or "question" not in row:
        raise _BadRow("missing 'id' or 'question' (not a MedQuAD line)")
    return FaqRecord(
        id=_text(row["id"]),
        question=_text(row["question"]),
        answer=_text(row.get("answer")),
        source=_text(row.get("source")),
        url=_text(row.get("url")),
        metadata={key: row[key] for key in MEDQUAD_METADATA if key in row},
    )


def _quebec(row: dict[str, Any]) -> FaqRecord | None:
    if "passage_id" not in row or "faq_question" not in row:
        raise _BadRow("missing 'passage_id' or 'faq_question' (not a Quebec FAQ line)")
    if row.get("reference_type", "faq") != "faq":
        return None  # the out-of-distribution placeholder passage
    return FaqRecord(
        id=_text(row["passage_id"]),
        question=_text(row["faq_question"]),
        answer=_text(row.get("answer")),
        source="quebec.ca",
        url=_text(row.get("uri")),
        metadata={"page_title": row.get("page_title"), "section_headers": row.get("section_headers")},
    )


def _jhu(row: dict[str, Any]) -> FaqRecord:
    """A JHU FAQ bank row; its ids ("Public Health Agency of Canada|||-34...") hold spaces, which become ``_``."""
    if "id" not in row or "question" not in row:
        raise _BadRow("missing 'id' or 'question' (not a JHU FAQ bank line)")
    return FaqRecord(
        id=safe_id(_text(row["id"])),
        question=_text(row["question"]),
        answer=_text(row.get("answer")),
        source=_text(row.get("source_name")),
        url=_text(row.get("source_url")),
        updated=_text(row.get("date_last_changed")),
        metadata={key: row[key] for key in JHU_METADATA if key in row},
    )


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        raise TypeError(f"expected text, got {type(value).__name__}")
    return str(value).strip()


_CONVERTERS: dict[str, Callable[..., FaqRecord | None]] = {
    "jsonl": _generic,
    "csv": _generic,
    "medquad": _medquad,
    "quebec": _quebec,
    "jhu": _jhu,
}


def write_records(records: list[FaqRecord], path: Path) -> None:
    """Write records as JSONL (one `FaqRecord.to_dict()` per line)."""
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")


def read_records(path: Path) -> list[FaqRecord]:
    """Read records written by :func:`write_records`."""
    return [FaqRecord.from_dict(row) for _, row in iter_jsonl(path)]
