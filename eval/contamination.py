"""The contamination audit (`medfaq data audit`): which benchmark questions, dev and test, a model medfaq trains has
seen in its training data.

Every benchmark's questions are compared with every text of the training sources: the splits index/datasets.py
declares (`TRAINING_SPLITS`), read as training reads them (a `train` split through
:func:`~retriever.biencoder.distill_data.source_texts`: its questions and what they are paired with, MedQuAD's
questions; a calibration split's CHQs and summaries), and the training part of ``medquad-chq`` that the rank
summarizer learns from (`RANK_SOURCE`, `retriever.trained_models.RANK_SPLIT`). A question overlaps a source exactly when
their normalised texts are equal (:func:`~eval.benchmarks.question_key`), and is a near-duplicate of it when the
Jaccard similarity of their sets of character `SHINGLE`-grams reaches `NEAR`. Near-duplicates are found through an
inverted index of the rarest shingles of each set (prefix filtering: two sets that similar share one of them), which
finds every pair above the threshold without comparing all pairs: all benchmarks against all sources take seconds.

The query -> FAQ training and the distilled student drop exact copies of the evaluation splits' questions
(:func:`~retriever.training.pair_data.heldout_texts`); the summarizer and the question writer read their splits as
they are, and none of them drops near-duplicates.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from medfaq.common.runtime import MedfaqError
from medfaq.eval.benchmarks import (
    BENCHMARKS,
    CHQ_PARTS,
    Benchmark,
    benchmark_kind,
    by_kind,
    kind_heading,
    make_benchmark,
    question_key,
    split_queries,
    with_distractors,
)
from medfaq.index.datasets import TRAINING_SPLITS

SHINGLE = 5  # characters per shingle
NEAR = 0.9  # Jaccard similarity of the shingle sets at or above which a question is a near-duplicate
RANK_SOURCE = "medquad-chq:train"  # the training part of medquad-chq (split-0) the rank summarizer learns from


def audited_benchmark(name: str, data_root: Path | None = None) -> Benchmark:
    """Benchmark `name` as made for its questions: ``medquad-chq``'s questions and ids do not depend on the MedQuAD
    index its corpus is read from, so it is made without it."""
    if name == "medquad-chq":
        return with_distractors(name, [make_benchmark(part, data_root) for part in CHQ_PARTS], [])
    return make_benchmark(name, data_root)


def training_texts(data_root: Path | None = None) -> dict[str, list[str]]:
    """Every training source (``<dataset>:<split>``, `RANK_SOURCE`) -> its texts."""
    from medfaq.eval.summarization_data import load_pairs
    from medfaq.retriever.biencoder.distill_data import source_texts
    from medfaq.retriever.trained_models import RANK_SPLIT

    sources: dict[str, list[str]] = {}
    for name, split in TRAINING_SPLITS:
        if split == "train":
            sources[f"{name}:train"] = source_texts(name, data_root)
        else:
            pairs = load_pairs(f"{name}:{split}", data_root)
            sources[f"{name}:{split}"] = [pair.chq for pair in pairs] + [pair.faq for pair in pairs]
    rank_part = split_queries(audited_benchmark("medquad-chq", data_root), int(RANK_SPLIT.removeprefix("split-")))
    sources[RANK_SOURCE] = [query["text"] for query in rank_part["train"][0]]
    return sources


def shingles(text: str) -> set[int]:
    """The character `SHINGLE`-grams of a normalised text, hashed (a text shorter than one shingle is one)."""
    key = question_key(text)
    grams = {key[i : i + SHINGLE] for i in range(max(1, len(key) - SHINGLE + 1))}
    return {zlib.crc32(gram.encode()) for gram in grams}


def jaccard(a: set[int], b: set[int]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


class ShingleIndex:
    """Texts' shingle sets, searched for those whose Jaccard similarity to a text's reaches `threshold`.

    Shingles are ordered rarest first (by their frequency among the indexed sets, then their hash); a set's prefix is
    its first ``|x| - ceil(threshold * |x|) + 1`` shingles. Two sets with similarity >= threshold share at least
    ``ceil(threshold * max(|x|, |y|))`` shingles, so their prefixes meet: only the sets whose prefix holds a shingle of
    the query's prefix, and whose size allows the threshold, are compared."""

    def __init__(self, texts: list[str], threshold: float = NEAR) -> None:
        if not 0 < threshold <= 1:
            raise MedfaqError(f"a near-duplicate threshold is in (0, 1], got {threshold}")
        self.threshold = threshold
        self.sets = [shingles(text) for text in texts]
        self.frequency = Counter(gram for grams in self.sets for gram in grams)
        self.postings: dict[int, list[int]] = defaultdict(list)
        for i, grams in enumerate(self.sets):
            for gram in self._prefix(grams):
                self.postings[gram].append(i)

    def _prefix(self, grams: set[int]) -> list[int]:
        size = len(grams) - math.ceil(self.threshold * len(grams)) + 1
        return sorted(grams, key=lambda gram: (self.frequency.get(gram, 0), gram))[:size]

    def search(self, text: str) -> list[tuple[int, float]]:
        """(position of an indexed text, similarity) of every indexed text at or above the threshold."""
        grams = shingles(text)
        low, high = self.threshold * len(grams), len(grams) / self.threshold
        candidates = {i for gram in self._prefix(grams) for i in self.postings.get(gram, ())}
        found = [(i, jaccard(grams, self.sets[i])) for i in candidates if low <= len(self.sets[i]) <= high]
        return sorted(((i, s) for i, s in found if s >= self.threshold), key=lambda item: -item[1])


@dataclass(frozen=True)
class Overlap:
    """A benchmark question found in a training source: `match` ``exact`` or ``near`` (with its `similarity`)."""

    query_id: str
    split: str
    match: str
    source: str
    similarity: float
    question: str
    training_text: str


@dataclass
class BenchmarkAudit:
    """One benchmark's questions and their overlaps with the training sources (the best one per source)."""

    name: str
    questions: dict[str, str]  # query id -> its split (dev, test)
    overlaps: list[Overlap]

    @property
    def kind(self) -> str:
        return benchmark_kind(self.name)

    def match_of(self) -> dict[str, str]:
        """Query id -> ``exact`` (an exact overlap with some source) or ``near`` (near-duplicates only)."""
        found: dict[str, str] = {}
        for overlap in self.overlaps:
            if found.get(overlap.query_id) != "exact":
                found[overlap.query_id] = overlap.match
        return found

    def clean_ids(self) -> list[str]:
        """The ids of the questions no training source holds, in benchmark order."""
        matched = self.match_of()
        return [query_id for query_id in self.questions if query_id not in matched]

    def split_counts(self) -> dict[str, dict[str, int]]:
        """Per split: questions, exact overlaps, near-duplicates (and no exact overlap), clean questions."""
        matched = self.match_of()
        counts: dict[str, dict[str, int]] = {}
        for query_id, split in self.questions.items():
            row = counts.setdefault(split, {"questions": 0, "exact": 0, "near": 0, "clean": 0})
            row["questions"] += 1
            row[matched.get(query_id, "clean")] += 1
        return dict(sorted(counts.items()))

    def source_counts(self) -> dict[str, dict[str, int]]:
        """Per training source: the questions it holds exactly and those it holds a near-duplicate of."""
        counts: dict[str, dict[str, int]] = {}
        for overlap in self.overlaps:
            counts.setdefault(overlap.source, {"exact": 0, "near": 0})[overlap.match] += 1
        return dict(sorted(counts.items()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "splits": self.split_counts(),
            "sources": self.source_counts(),
            "overlaps": [asdict(overlap) for overlap in self.overlaps],
        }


def find_overlaps(
    benchmark: Benchmark, index: ShingleIndex, texts: list[str], owners: list[set[str]]
) -> BenchmarkAudit:
    """`benchmark`'s questions against the unique source `texts` indexed in `index`, `owners[i]` the sources of
    ``texts[i]``: for each question and source, its exact overlap, else its nearest near-duplicate."""
    position = {question_key(text): i for i, text in enumerate(texts)}
    overlaps = []
    for query in benchmark.queries:
        split = query.get("metadata", {}).get("split", "test")
        best: dict[str, Overlap] = {}
        exact = position.get(question_key(query["text"]))
        matches = [(exact, 1.0)] if exact is not None else []
        for i, similarity in [*matches, *index.search(query["text"])]:
            found = ("exact" if i == exact else "near", round(similarity, 4), query["text"], texts[i])
            for source in sorted(owners[i] - set(best)):
                best[source] = Overlap(query["_id"], split, found[0], source, *found[1:])
        overlaps += best.values()
    questions = {q["_id"]: q.get("metadata", {}).get("split", "test") for q in benchmark.queries}
    return BenchmarkAudit(benchmark.name, questions, overlaps)


def audit_benchmarks(
    names: list[str] | None = None,
    data_root: Path | None = None,
    near: float = NEAR,
    sources: list[str] | None = None,
) -> list[BenchmarkAudit]:
    """Audit benchmarks `names` (default: all) against training `sources` (default: all, :func:`training_texts`);
    in report order (real banks first)."""
    names = list(names or BENCHMARKS)
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        raise MedfaqError(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(BENCHMARKS)}")
    every = training_texts(data_root)
    unknown = [source for source in sources or [] if source not in every]
    if unknown:
        raise MedfaqError(f"unknown training source {unknown[0]!r}; choose from {', '.join(every)}")
    chosen = {source: texts for source, texts in every.items() if not sources or source in sources}
    unique: dict[str, int] = {}
    texts: list[str] = []
    owners: list[set[str]] = []
    for source, texts_of_source in chosen.items():
        for text in texts_of_source:
            key = question_key(text)
            if key not in unique:
                unique[key] = len(texts)
                texts.append(text)
                owners.append(set())
            owners[unique[key]].add(source)
    index = ShingleIndex(texts, near)
    ordered = [name for _, members in by_kind(names) for name in members]
    return [find_overlaps(audited_benchmark(name, data_root), index, texts, owners) for name in ordered]


def format_audit(audits: list[BenchmarkAudit]) -> str:
    """A table per benchmark, under the heading of its kind: questions, exact overlaps, near-duplicates and clean
    questions per split, then the sources that hold its questions."""
    lines: list[str] = []
    for kind, names in by_kind(bench.name for bench in audits):
        lines += [f"== {kind_heading(kind)} ==", ""]
        for bench in (bench for bench in audits if bench.name in names):
            lines.append(bench.name)
            lines.append(f"  {'split':<6} {'questions':>9} {'exact':>6} {'near-duplicate':>14} {'clean':>6}")
            for split, row in bench.split_counts().items():
                cells = f"{row['questions']:>9} {row['exact']:>6} {row['near']:>14} {row['clean']:>6}"
                lines.append(f"  {split:<6} {cells}")
            sources = bench.source_counts()
            if sources:
                width = max(len("source"), *map(len, sources))
                lines.append(f"  {'source':<{width}} {'exact':>6} {'near-duplicate':>14}")
                lines += [f"  {s:<{width}} {c['exact']:>6} {c['near']:>14}" for s, c in sources.items()]
            else:
                lines.append("  no training source holds any of its questions")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_clean_ids(audits: list[BenchmarkAudit], directory: Path) -> dict[str, Path]:
    """``DIR/<benchmark>.txt``: the ids of each benchmark's clean questions, one a line (`medfaq eval retrieval
    --query-ids`)."""
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    for bench in audits:
        path = directory / f"{bench.name}.txt"
        path.write_text("".join(f"{query_id}\n" for query_id in bench.clean_ids()), encoding="utf-8")
        written[bench.name] = path
    return written
