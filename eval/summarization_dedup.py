"""Duplicate samples in question-summarization data, within and across splits and datasets, and a clean re-split.

Two samples are duplicates at a level when their keys are equal:

* ``exact``: the text as stored;
* ``normalised``: ECL's cleaning (newlines and double quotes removed, ``\\`` -> ``/``), then case-folded, punctuation
  dropped and whitespace collapsed;
* ``contained`` (near duplicates): normalised-equal, or the normalised CHQ of one (at least 8 words) occurs as a
  word sequence inside the other's (e.g. a truncated copy of a question); groups are closed transitively.

The key is built from the CHQ (as ECL de-duplicates) or, with ``field="pair"``, from the CHQ and the FAQ together
(``contained`` then also requires equal normalised FAQs).
:func:`resplit` keeps the first sample of every duplicate group (datasets in the order given, splits in file order),
shuffles with a seed and writes an 8:1:1 train/valid/test split per dataset in the ``shared/data`` layout.
"""

from __future__ import annotations

import json
import random
import re
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from medfaq.common.runtime import MedfaqError
from medfaq.eval.summarization_data import dataset_splits, load_summary_rows, parse_spec
from medfaq.index.datasets import get_dataset

LEVELS = ("exact", "normalised", "contained")
MIN_CONTAINED_WORDS = 8
FIELDS = ("chq", "pair")
PUNCTUATION = re.compile(r"[^\w\s]")
SPLIT_RATIOS = (("train", 0.8), ("valid", 0.1), ("test", 0.1))


def ecl_clean(text: str) -> str:
    """ECL's preprocessing of a question: newlines and double quotes removed, backslashes turned into slashes."""
    return text.replace("\n", " ").replace('"', "").replace("\\", "/")


def normalise(text: str) -> str:
    """ECL-cleaned, case-folded, punctuation removed, whitespace collapsed."""
    return " ".join(PUNCTUATION.sub(" ", ecl_clean(text).casefold()).split())


def sample_key(row: dict, level: str, key_field: str = "chq") -> str:
    """The duplicate key of a row at level "exact" or "normalised" over `key_field` ("chq" or "pair")."""
    texts = [row["chq"]] if key_field == "chq" else [row["chq"], row["faq"]]
    return "\x00".join(texts if level == "exact" else map(normalise, texts))


def group_keys(rows: list[dict], level: str, key_field: str = "chq") -> list[str]:
    """One key per row; rows with equal keys are duplicates at `level`."""
    if level not in LEVELS:
        raise MedfaqError(f"unknown duplicate level {level!r}; choose {', '.join(LEVELS)}")
    if level != "contained":
        return [sample_key(row, level, key_field) for row in rows]
    keys = [sample_key(row, "normalised", key_field) for row in rows]
    parent = list(range(len(rows)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_with_key: dict[str, int] = {}
    for i, key in enumerate(keys):
        parent[root(i)] = root(first_with_key.setdefault(key, i))
    words = [normalise(row["chq"]).split() for row in rows]
    faqs = [normalise(row["faq"]) if key_field == "pair" else "" for row in rows]
    containing: dict[tuple[str, ...], set[int]] = defaultdict(set)  # word n-gram -> rows whose CHQ contains it
    for i, sequence in enumerate(words):
        for start in range(len(sequence) - MIN_CONTAINED_WORDS + 1):
            containing[tuple(sequence[start : start + MIN_CONTAINED_WORDS])].add(i)
    for i, sequence in enumerate(words):
        if len(sequence) < MIN_CONTAINED_WORDS:
            continue
        inner = f" {' '.join(sequence)} "
        for j in containing[tuple(sequence[:MIN_CONTAINED_WORDS])]:
            if j != i and faqs[i] == faqs[j] and inner in f" {' '.join(words[j])} ":
                parent[root(i)] = root(j)
    return [keys[root(i)] for i in range(len(rows))]


@dataclass(frozen=True)
class Sample:
    dataset: str
    split: str
    id: str
    row: dict

    @property
    def source(self) -> str:
        return f"{self.dataset}:{self.split}"


def collect_samples(datasets: list[str], data_root: Path | None = None) -> list[Sample]:
    """All summarization samples of `datasets` ("meqsum", or "meqsum:test" for one split), in order."""
    samples = []
    for name in datasets:
        parts = parse_spec(name) if ":" in name else [(name, split) for split in dataset_splits(name)]
        for dataset, split in parts:
            samples += [Sample(dataset, split, i, row) for i, row in load_summary_rows(dataset, split, data_root)]
    if not samples:
        raise MedfaqError(f"no samples in {', '.join(datasets)}")
    return samples


@dataclass
class LevelReport:
    """Duplicates at one level: counts per split, overlaps between splits, and example groups."""

    groups: int = 0  # keys that occur more than once
    removable: int = 0  # samples beyond the first of each group
    within: dict[str, int] = field(default_factory=dict)  # source -> samples that repeat a key earlier in that source
    across: dict[str, int] = field(default_factory=dict)  # "a | b" -> keys present in both sources
    examples: list[list[dict]] = field(default_factory=list)


@dataclass
class DedupReport:
    key_field: str
    sizes: dict[str, int]
    levels: dict[str, LevelReport]

    def to_dict(self) -> dict:
        return {
            "field": self.key_field,
            "sizes": self.sizes,
            "levels": {name: vars(level) for name, level in self.levels.items()},
        }

    def format(self) -> str:
        lines = [f"{sum(self.sizes.values())} samples, duplicates by {self.key_field}:"]
        lines += [f"  {source:<24} {size:>6}" for source, size in self.sizes.items()]
        for name, level in self.levels.items():
            total = sum(self.sizes.values())
            lines.append(
                f"{name}: {level.groups} duplicate groups, {level.removable} removable samples "
                f"({100 * level.removable / total:.1f}%)"
            )
            lines += [f"  within {source:<24} {count:>5}" for source, count in level.within.items() if count]
            lines += [f"  across {pair:<40} {count:>5}" for pair, count in level.across.items() if count]
            for group in level.examples:
                lines.append("  e.g. " + " == ".join(f"{s['source']}#{s['id']}" for s in group))
                lines.append(f"       {group[0]['text']!r}")
        return "\n".join(lines)


def find_duplicates(
    samples: list[Sample], key_field: str = "chq", n_examples: int = 3, example_chars: int = 100
) -> DedupReport:
    """Count duplicates at every level within each split and between every two splits."""
    if key_field not in FIELDS:
        raise MedfaqError(f"unknown duplicate field {key_field!r}; choose {' or '.join(FIELDS)}")
    sizes: dict[str, int] = defaultdict(int)
    for sample in samples:
        sizes[sample.source] += 1
    sources = list(sizes)
    levels = {}
    for level in LEVELS:
        groups: dict[str, list[Sample]] = defaultdict(list)
        for sample, key in zip(samples, group_keys([s.row for s in samples], level, key_field)):
            groups[key].append(sample)
        repeated = [group for group in groups.values() if len(group) > 1]
        report = LevelReport(groups=len(repeated), removable=len(samples) - len(groups))
        per_source = [{s.source for s in group} for group in groups.values()]
        report.within = {source: sizes[source] - sum(source in present for present in per_source) for source in sources}
        report.across = {
            f"{a} | {b}": sum(a in present and b in present for present in per_source)
            for a, b in combinations(sources, 2)
        }
        report.examples = [
            [{"source": s.source, "id": s.id, "text": s.row["chq"][:example_chars]} for s in group]
            for group in repeated[:n_examples]
        ]
        levels[level] = report
    return DedupReport(key_field, dict(sizes), levels)


def resplit(
    samples: list[Sample], out: Path, seed: int, key_field: str = "chq", level: str = "normalised"
) -> dict[str, dict[str, int]]:
    """Write a de-duplicated, seeded 8:1:1 re-split of each dataset to ``out/<subdir>/{train,valid,test}.jsonl``.

    A sample is dropped when an earlier sample (any dataset) has the same key. Rows keep their fields; ``split`` is
    set to the new split and ``original_split`` records the old one. Returns ``{dataset: {split: count}}``.
    """
    seen: set[str] = set()
    kept: dict[str, list[Sample]] = defaultdict(list)
    for sample, key in zip(samples, group_keys([s.row for s in samples], level, key_field)):
        if key not in seen:
            seen.add(key)
            kept[sample.dataset].append(sample)
    counts: dict[str, dict[str, int]] = {}
    for dataset, dataset_samples in kept.items():
        order = list(dataset_samples)
        random.Random(f"{seed}\x00{dataset}").shuffle(order)
        target = Path(out).expanduser() / get_dataset(dataset).subdir
        target.mkdir(parents=True, exist_ok=True)
        counts[dataset] = {}
        start = 0
        for index, (split, ratio) in enumerate(SPLIT_RATIOS):
            end = len(order) if index == len(SPLIT_RATIOS) - 1 else start + round(ratio * len(order))
            rows = [s.row | {"split": split, "original_split": s.split} for s in order[start:end]]
            with (target / f"{split}.jsonl").open("w", encoding="utf-8") as handle:
                handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
            counts[dataset][split] = len(rows)
            start = end
    return counts
