"""CHQ -> FAQ question-summarization pairs from the registered datasets (`medfaq data fetch NAME`; those with
summarization splits in index/datasets.py).

A spec is ``"<dataset>:<split>"`` (e.g. ``meqsum:test``), or a JSONL file of ``{"chq", "faq"}`` rows (e.g. a
benchmark part's ``pairs.jsonl``, `medfaq data split-benchmark`); several can be joined with ``+``
(``chq_summ:train+healthcaremagic:train``). Files are read from ``data_dir()/<subdir>`` or, with `data_root`,
from ``data_root/<subdir>`` (the ``../shared/data`` layout, or the output of ``medfaq data dedup --resplit``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from medfaq.common.runtime import MedfaqError, data_dir
from medfaq.index.datasets import SUMMARIZATION_DATASETS, get_dataset

logger = logging.getLogger("medfaq.summarization_data")


@dataclass(frozen=True)
class SummaryPair:
    """One consumer health question and its reference FAQ-style summary; `id` is ``<dataset>:<split>:<row id>``."""

    id: str
    chq: str
    faq: str
    source: str  # "<dataset>:<split>"


def dataset_splits(dataset: str) -> tuple[str, ...]:
    """The published splits of a summarization dataset; an unknown name is a one-line error."""
    if dataset not in SUMMARIZATION_DATASETS:
        raise MedfaqError(f"unknown summarization dataset {dataset!r}; known: {', '.join(SUMMARIZATION_DATASETS)}")
    return SUMMARIZATION_DATASETS[dataset]


def parse_spec(spec: str) -> list[tuple[str, str]]:
    """``"meqsum:test+rqe:valid"`` -> ``[("meqsum", "test"), ("rqe", "valid")]``, checked against the registry."""
    parts = []
    for part in spec.split("+"):
        dataset, _, split = part.strip().partition(":")
        splits = dataset_splits(dataset)
        if not split:
            raise MedfaqError(f"{spec!r}: name a split, e.g. {dataset}:{splits[-1]} ({', '.join(splits)})")
        parts.append((dataset, split))
    return parts


def split_path(dataset: str, split: str, data_root: Path | None = None) -> Path:
    """The JSONL file of one split (not checked for existence)."""
    root = Path(data_root).expanduser() if data_root is not None else data_dir()
    return root / get_dataset(dataset).subdir / f"{split}.jsonl"


def read_jsonl(path: Path) -> list[dict]:
    """JSON objects, one per non-empty line; a bad line is a one-line error naming the file and line."""
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise MedfaqError(f"{path}:{number}: malformed JSON: {error.msg}") from None
    return rows


def load_split_rows(dataset: str, split: str, data_root: Path | None = None) -> list[dict]:
    """The raw rows of one split; a missing file is a one-line error saying how to fetch it."""
    path = split_path(dataset, split, data_root)
    if not path.is_file():
        hint = f"splits: {', '.join(SUMMARIZATION_DATASETS[dataset])}; "
        hint += "expected the shared/data layout" if data_root is not None else f"run `medfaq data fetch {dataset}`"
        raise MedfaqError(f"{dataset}:{split}: {path} not found ({hint})")
    return read_jsonl(path)


def row_id(row: dict, number: int) -> str:
    """A row's own id (``id``, or ``pid`` for RQE), else its 0-based position."""
    return str(row.get("id", row.get("pid", number)))


def load_summary_rows(dataset: str, split: str, data_root: Path | None = None) -> list[tuple[str, dict]]:
    """(row id, row) for the summarization rows of one split (RQE: label-1 pairs only), each with chq/faq text.

    Rows whose CHQ or FAQ is blank are skipped with a warning (RQE train has one).
    """
    rows, blank = [], 0
    for number, row in enumerate(load_split_rows(dataset, split, data_root)):
        if get_dataset(dataset).positive_only and row.get("label") != 1:
            continue
        if not isinstance(row.get("chq"), str) or not isinstance(row.get("faq"), str):
            raise MedfaqError(f"{dataset}:{split}: row {number + 1} has no 'chq'/'faq' text")
        if row["chq"].strip() and row["faq"].strip():
            rows.append((row_id(row, number), row))
        else:
            blank += 1
    if blank:
        logger.warning("%s:%s: skipped %d rows with a blank chq or faq", dataset, split, blank)
    return rows


def load_pairs(spec: str, data_root: Path | None = None) -> list[SummaryPair]:
    """The CHQ -> FAQ pairs of `spec` (RQE: label-1 pairs only), in the order of its parts and of each file. A part is
    a dataset split, a pairs file (``.jsonl``), or an index directory: the questions `medfaq index adapt` wrote for
    its FAQs and kept by the round trip, each with its FAQ's question."""
    pairs = []
    for part in (part.strip() for part in spec.split("+")):
        if part.endswith(".jsonl"):
            pairs.extend(file_pairs(Path(part).expanduser()))
            continue
        if Path(part).expanduser().is_dir():
            from medfaq.retriever.decisions.adaptation import training_pairs_file

            pairs.extend(file_pairs(training_pairs_file(Path(part).expanduser())))
            continue
        for dataset, split in parse_spec(part):
            source = f"{dataset}:{split}"
            for identifier, row in load_summary_rows(dataset, split, data_root):
                pairs.append(SummaryPair(f"{source}:{identifier}", row["chq"], row["faq"], source))
    return pairs


def file_pairs(path: Path) -> list[SummaryPair]:
    """The ``{"chq", "faq"}`` rows of a JSONL file; a missing file or a row without both texts is a one-line error."""
    if not path.is_file():
        raise MedfaqError(f"{path}: no such pairs file")
    pairs = []
    for number, row in enumerate(read_jsonl(path)):
        if not all(isinstance(row.get(key), str) and row[key].strip() for key in ("chq", "faq")):
            raise MedfaqError(f"{path}: row {number + 1} has no 'chq'/'faq' text")
        pairs.append(SummaryPair(f"{path.name}:{row_id(row, number)}", row["chq"], row["faq"], str(path)))
    return pairs
