"""Batch search files: query JSONL in (medfaq ``{"id", "question"}`` or BEIR ``{"_id", "text"}`` lines), run JSONL
or TREC run files out."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medfaq.common.runtime import MedfaqError
from medfaq.index.collections import LoadReport
from medfaq.index.records import id_problem
from medfaq.retriever.search import invalid_text_position

if TYPE_CHECKING:
    from medfaq.retriever.pipeline import SearchResponse

RUN_FORMATS = ("jsonl", "trec")
RESULT_FIELDS = ("id", "score", "rank", "question", "stage_scores")
STDIO_NAMES = ("-", "/dev/stdin", "/dev/stdout")


@dataclass
class QueryFile:
    """Queries read from a JSONL file of ``{"id": ..., "question": ...}`` lines."""

    ids: list[str]
    questions: list[str]
    report: LoadReport
    lines: list[int]

    def check_trec_ids(self) -> None:
        """A one-line error naming the first id (and its line) that a TREC run cannot carry."""
        for query_id, line_no in zip(self.ids, self.lines, strict=True):
            problem = id_problem(query_id)
            if problem:
                raise MedfaqError(
                    f"{self.report.path}:{line_no}: query id {query_id!r} {problem}; "
                    "use ids without whitespace or --format jsonl"
                )


def is_stdio(path: str | Path) -> bool:
    """True for ``-`` (and /dev/stdin, /dev/stdout): read stdin or write stdout instead of a file."""
    return str(path) in STDIO_NAMES


def _raw_lines(path: Path) -> Iterator[bytes]:
    if is_stdio(path):
        yield from sys.stdin.buffer
        return
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise MedfaqError(f"file not found: {path}") from None
    except OSError as error:
        raise MedfaqError(f"cannot read {path}: {error.strerror}") from None
    with handle:
        yield from handle


def _parse_query(raw: bytes, line_no: int) -> tuple[dict[str, Any] | None, str | None]:
    """The query object of one line (None for a blank line), or the problem with it."""
    try:
        line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
    except UnicodeDecodeError as error:
        return None, f"not UTF-8 (byte 0x{raw[error.start]:02x} at column {error.start + 1})"
    if not line.strip():
        return None, None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        return None, f"malformed JSON ({error.msg} at column {error.colno})"
    if not isinstance(row, dict):
        return None, "expected a JSON object"
    if "_id" in row and "text" in row and "id" not in row and "question" not in row:
        row = {"id": row["_id"], "question": row["text"]}
    if "id" not in row or "question" not in row:
        return None, "missing 'id' or 'question'"
    if not isinstance(row["question"], str) or not row["question"].strip():
        return None, "empty question"
    for field in ("id", "question"):
        invalid = invalid_text_position(str(row[field]))
        if invalid:
            return None, f"{field} is not valid UTF-8 ({invalid})"
    return row, None


def read_queries(path: str | Path, skip_bad: bool = False) -> QueryFile:
    """Read a query file (``-`` or /dev/stdin: standard input). Bytes that are not UTF-8, lone surrogates (JSON
    ``\\udce9`` escapes), malformed lines, missing fields, empty questions and duplicate ids are one-line errors
    naming the line; with `skip_bad` all but duplicate ids are skipped and counted instead."""
    path = Path(path)
    name = "<stdin>" if is_stdio(path) else str(path)
    report = LoadReport(name, "queries")
    ids: list[str] = []
    questions: list[str] = []
    seen: dict[str, int] = {}
    lines: list[int] = []
    for line_no, raw in enumerate(_raw_lines(path), start=1):
        row, problem = _parse_query(raw, line_no)
        if row is not None and str(row["id"]) in seen:
            raise MedfaqError(
                f"{name}:{line_no}: duplicate query id {row['id']!r} (first on line {seen[str(row['id'])]})"
            )
        if row is not None:
            seen[str(row["id"])] = line_no
            ids.append(str(row["id"]))
            questions.append(row["question"])
            lines.append(line_no)
        elif problem is not None:
            if not skip_bad:
                raise MedfaqError(f"{name}:{line_no}: {problem} (use --skip-bad to skip such lines)")
            report.skipped_bad += 1
            report.bad_lines.append(line_no)
    if not ids:
        raise MedfaqError(f"{name}: no queries")
    report.loaded = len(ids)
    return QueryFile(ids, questions, report, lines)


def _run_lines(query_ids: list[str], responses: list[SearchResponse], fmt: str, name: str) -> Iterator[str]:
    for query_id, response in zip(query_ids, responses, strict=True):
        if fmt == "trec":
            for hit in response.hits:
                yield f"{query_id} Q0 {hit.id} {hit.rank} {hit.score:.6f} {name}\n"
            continue
        data = response.to_dict()
        results = [{key: hit[key] for key in RESULT_FIELDS} for hit in data.pop("hits")]
        line = {"id": query_id, "query": data.pop("query"), **data, "results": results}
        yield json.dumps(line, ensure_ascii=False) + "\n"


def write_run(path: str | Path, query_ids: list[str], responses: list[SearchResponse], fmt: str, name: str) -> None:
    """Write responses as JSONL (``{"id", "query", "summary", "entities", "abstained", "confidence", "timings_ms",
    "results": [{"id", "score", "rank", "question", "stage_scores"}]}``) or as a TREC run (all hits, also of
    abstained questions), to `path` (atomically) or to stdout when `path` is ``-``."""
    if fmt not in RUN_FORMATS:
        raise MedfaqError(f"unknown run format {fmt!r}; choose one of {', '.join(RUN_FORMATS)}")
    if fmt == "trec":
        _check_trec_ids(query_ids, responses)
    lines = _run_lines(query_ids, responses, fmt, name)
    if is_stdio(path):
        sys.stdout.writelines(lines)
        sys.stdout.flush()
        return
    write_text_atomic(path, lines)


def _check_trec_ids(query_ids: list[str], responses: list[SearchResponse]) -> None:
    """Refuse, before a line is written, query or FAQ ids a TREC run cannot carry (FAQ ids of an index built before
    ids were checked)."""
    for query_id, response in zip(query_ids, responses, strict=True):
        for kind, value in [("query", query_id), *(("FAQ", hit.id) for hit in response.hits)]:
            problem = id_problem(value)
            if problem:
                raise MedfaqError(f"{kind} id {value!r} {problem}; write the run with --format jsonl")


def check_output(path: str | Path) -> None:
    """Fail early, with one line, when `path` cannot be written (a directory, or a folder that cannot be made or
    written to); ``-`` (stdout) always can."""
    if is_stdio(path):
        return
    path = Path(path)
    if path.is_dir():
        raise MedfaqError(f"{path} is a directory; pass a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise MedfaqError(f"cannot write {path}: {error.strerror}") from None
    if not os.access(path.parent, os.W_OK):
        raise MedfaqError(f"cannot write {path}: permission denied")


def check_not_an_input(output: str | Path, *inputs: str | Path | None, option: str = "--output") -> None:
    """Refuse, in one line, an output file that is one of the command's input files or lies inside one of its
    input directories (an index, a model): writing it would destroy the input. ``-`` is never such a file."""
    if is_stdio(output):
        return
    target = Path(output).expanduser().resolve()
    for given in inputs:
        if given is None or is_stdio(given):
            continue
        source = Path(given).expanduser()
        same = source.resolve() == target or (source.exists() and target.exists() and os.path.samefile(source, target))
        if same:
            raise MedfaqError(f"{option} {output} is the input file {given}; write the results to another file")
        if source.is_dir() and source.resolve() in target.parents:
            raise MedfaqError(f"{option} {output} is inside the input {given}; write the results outside it")


def write_text_atomic(path: str | Path, lines: Iterator[str] | list[str]) -> None:
    """Write `lines` to a temporary file beside `path`, then rename it over `path` (readers never see half)."""
    path = Path(path)
    check_output(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as out:
            out.writelines(lines)
    except OSError as error:
        raise MedfaqError(f"cannot write {path}: {error.strerror}") from None
    tmp.replace(path)
