"""Batch search files: query JSONL in (medfaq ``{"id", "question"}`` or BEIR ``{"_id", "text"}`` lines), run JSONL
or TREC run files out."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from index.collections import LoadReport, iter_jsonl
from index.runtime import MedfaqError
from retriever.pipeline import SearchResponse

RUN_FORMATS = ("jsonl", "trec")
RESULT_FIELDS = ("id", "score", "rank", "question", "stage_scores")


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
        if "_id" in row and "text" in row and "id" not in row and "question" not in row:
            row = {"id": row["_id"], "question": row["text"]}
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


def write_run(path: str | Path, query_ids: list[str], responses: list[SearchResponse], fmt: str, name: str) -> None:
    """Write responses as JSONL (``{"id", "query", "summary", "entities", "abstained", "confidence", "timings_ms",
    "results": [{"id", "score", "rank", "question", "stage_scores"}]}``) or as a TREC run (all hits, also of
    abstained questions)."""
    if fmt not in RUN_FORMATS:
        raise MedfaqError(f"unknown run format {fmt!r}; choose one of {', '.join(RUN_FORMATS)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for query_id, response in zip(query_ids, responses, strict=True):
            if fmt == "trec":
                for hit in response.hits:
                    out.write(f"{query_id} Q0 {hit.id} {hit.rank} {hit.score:.6f} {name}\n")
                continue
            data = response.to_dict()
            results = [{key: hit[key] for key in RESULT_FIELDS} for hit in data.pop("hits")]
            line = {"id": query_id, "query": data.pop("query"), **data, "results": results}
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
    tmp.replace(path)
