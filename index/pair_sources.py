"""Loaders for the labelled question sets behind the duplicate detector and the reranker.

Each reads a fetched dataset under ``data_dir()`` (after ``medfaq data fetch NAME``), or `data_root` laid out like
``../shared/data``, and returns plain dicts in the dataset's own field names. Missing files give one-line errors.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from medfaq.common.runtime import MedfaqError
from medfaq.index.collections import iter_jsonl
from medfaq.index.datasets import dataset_dir, get_dataset

MQP_COLUMNS = ("dr_id", "question_1", "question_2", "label")


def dataset_file(name: str, file: str, data_root: Path | None = None) -> Path:
    """``<data_root or data_dir()>/<subdir of NAME>/<file>``; a one-line error when it is not there."""
    base = Path(data_root).expanduser() / get_dataset(name).subdir if data_root is not None else dataset_dir(name)
    path = base / file
    if not path.is_file():
        hint = f"expected the shared/data layout in {data_root}" if data_root else f"run `medfaq data fetch {name}`"
        raise MedfaqError(f"{path} not found: {hint}")
    return path


def load_mqp(data_root: Path | None = None) -> list[dict[str, Any]]:
    """Curai MQP rows: ``id`` (row), ``dr_id``, ``group_id`` (index of the distinct `question_1`), both questions,
    ``label`` (1 similar, 0 different). `mqp.csv` has no header: dr_id, question_1, question_2, label."""
    path = dataset_file("mqp", "mqp.csv", data_root)
    groups: dict[str, int] = {}
    rows = []
    with path.open(encoding="utf-8", newline="") as handle:
        for line_no, cells in enumerate(csv.reader(handle), start=1):
            if len(cells) != len(MQP_COLUMNS) or cells[3].strip() not in {"0", "1"}:
                raise MedfaqError(f"{path}:{line_no}: expected 4 columns {', '.join(MQP_COLUMNS)} with label 0/1")
            row = dict(zip(MQP_COLUMNS, cells, strict=True))
            rows.append(
                {
                    "id": line_no - 1,
                    "dr_id": row["dr_id"].strip(),
                    "group_id": groups.setdefault(row["question_1"], len(groups)),
                    "question_1": row["question_1"],
                    "question_2": row["question_2"],
                    "label": int(row["label"]),
                }
            )
    return rows


def load_jsonl_rows(name: str, file: str, data_root: Path | None = None) -> list[dict[str, Any]]:
    """All rows of one JSONL file of dataset `name` (e.g. ``("quebec", "train.jsonl")``, ``("rqe", "train.jsonl")``)."""
    return [row for _, row in iter_jsonl(dataset_file(name, file, data_root))]
