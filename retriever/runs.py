"""Batch search files: query JSONL in, run JSONL or TREC run files out."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from index.collections import LoadReport, iter_jsonl
from index.runtime import MedfaqError
from retriever.search import Hit

RUN_FORMATS = ("jsonl", "trec")


@dataclass
class QueryFile:
    """Queries read from a JSONL file of ``{"id": ..., "question": ...}`` lines."""

    ids: list[str]
    questions: list[str]
    report: LoadReport


def read_queries(path: str | Path, skip_bad: bool = False) -> QueryFile:
    """Read a query file; malformed lines, missing fields, empty questions and duplicate ids are one-line errors
    naming the line (malformed lines and empty questions are skipped and counted with `skip_bad`)."""
    path = Path(path)
    report = LoadReport(str(path), "queries")
    ids: list[str] = []
    questions: list[str] = []
    seen: dict[str, int] = {}
    for line_no, row in iter_jsonl(path, report, skip_bad):
        if "id" not in row or "question" not in row:
            problem = "missing 'id' or 'question'"
        elif not isinstance(row["question"], str) or not row["question"].strip():
            problem = "empty question"
        elif str(row["id"]) in seen:
            raise MedfaqError(
                f"{path}:{line_no}: duplicate query id {row['id']!r} (first on line {seen[str(row['id'])]})"
            )
        else:
            seen[str(row["id"])] = line_no
            ids.append(str(row["id"]))
            questions.append(row["question"])
            continue
        if not skip_bad:
            raise MedfaqError(f"{path}:{line_no}: {problem} (use --skip-bad to skip such lines)")
        report.skipped_bad += 1
        report.bad_lines.append(line_no)
    if not ids:
        raise MedfaqError(f"{path}: no queries")
    report.loaded = len(ids)
    return QueryFile(ids, questions, report)


def write_run(
    path: str | Path, query_ids: list[str], queries: list[str], hits: list[list[Hit]], fmt: str, name: str
) -> None:
    """Write results as JSONL (``{"id", "query", "results": [{"id", "score", "rank", "question"}]}``) or TREC."""
    if fmt not in RUN_FORMATS:
        raise MedfaqError(f"unknown run format {fmt!r}; choose one of {', '.join(RUN_FORMATS)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for query_id, query, row in zip(query_ids, queries, hits, strict=True):
            if fmt == "trec":
                for hit in row:
                    out.write(f"{query_id} Q0 {hit.id} {hit.rank} {hit.score:.6f} {name}\n")
            else:
                results = [{"id": h.id, "score": h.score, "rank": h.rank, "question": h.question} for h in row]
                out.write(json.dumps({"id": query_id, "query": query, "results": results}, ensure_ascii=False) + "\n")
    tmp.replace(path)
