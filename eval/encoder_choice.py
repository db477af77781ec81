"""The default retrieval encoder, chosen by a rule written before any candidate was measured.

The rule (:class:`EncoderRule`): among the candidates (an encoder on a backend) whose median time to encode one long
consumer question (more than 60 words) is at most 200 ms and whose cold ``medfaq search`` (a new process searching a
small index once) takes at most 1.5 s of wall time on 2 CPU cores, the default is the one with the best development
quality; quality is the mean Recall@1 of dense search over the development queries (RQE's validation CHQs, Quebec's
development half), never a test set. Candidates within 0.5 R@1 of the best count as equal, and the fastest of them
(long-question p50) wins.

``measure`` runs each candidate; ``choose`` applies the rule to the numbers it is given:

    python -m medfaq.eval.encoder_choice --candidate minilm:onnx --candidate mpnet:onnx --candidate mpnet:onnx-int8 \\
        --dev /tmp/bench-rqe-valid --dev /tmp/bench-quebec --out encoder_choice.json
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from medfaq.common.runtime import MedfaqError
from medfaq.eval.script_args import print_report

LONG_WORDS = 60  # a long consumer question: more than this many words
LONG_QUESTIONS = 50  # MeQSum training CHQs timed per candidate
COLD_RUNS = 3


@dataclass(frozen=True)
class EncoderRule:
    """The bounds a default encoder must meet, and how close in quality two candidates count as equal."""

    max_long_p50_ms: float = 200.0
    max_cold_search_s: float = 1.5
    quality_tie: float = 0.5


@dataclass
class Candidate:
    """One encoder on one backend, with what the rule reads."""

    model: str
    backend: str
    dev_recall_at_1: float
    long_p50_ms: float
    cold_search_s: float
    per_set: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.model}:{self.backend}"


def choose(candidates: Sequence[Candidate], rule: EncoderRule = EncoderRule()) -> tuple[Candidate, dict[str, str]]:
    """The default by `rule`, and why each candidate was or was not chosen."""
    reasons: dict[str, str] = {}
    eligible = []
    for candidate in candidates:
        if candidate.long_p50_ms > rule.max_long_p50_ms:
            reasons[candidate.label] = f"long question p50 {candidate.long_p50_ms:.0f} ms > {rule.max_long_p50_ms:.0f}"
        elif candidate.cold_search_s > rule.max_cold_search_s:
            reasons[candidate.label] = f"cold search {candidate.cold_search_s:.2f} s > {rule.max_cold_search_s}"
        else:
            eligible.append(candidate)
    if not eligible:
        raise MedfaqError("no candidate meets the speed bounds: " + "; ".join(f"{k}: {v}" for k, v in reasons.items()))
    best = max(candidate.dev_recall_at_1 for candidate in eligible)
    tied = [candidate for candidate in eligible if candidate.dev_recall_at_1 >= best - rule.quality_tie]
    chosen = min(tied, key=lambda candidate: candidate.long_p50_ms)
    for candidate in eligible:
        if candidate is chosen:
            reasons[candidate.label] = "chosen"
        elif candidate in tied:
            reasons[candidate.label] = f"as good (within {rule.quality_tie} R@1) but slower"
        else:
            reasons[candidate.label] = f"dev R@1 {candidate.dev_recall_at_1:.1f} < {best:.1f}"
    return chosen, reasons


def development_recall(encoder: Any, benchmark: Any) -> float:
    """R@1 (%) of exact cosine search over `benchmark`'s corpus for its development queries: those marked ``dev``,
    or all judged ones where the benchmark is itself a validation set (none marked)."""
    from medfaq.eval.retrieval import exact_search_run, ranking_metrics

    dev = benchmark.dev_ids or set(benchmark.qrels)
    queries = [query for query in benchmark.queries if query["_id"] in dev and query["_id"] in benchmark.qrels]
    docs = benchmark.corpus
    query_vectors = encoder.encode([query["text"] for query in queries])
    doc_vectors = encoder.encode([row["text"] for row in docs])
    run = exact_search_run(
        [query["_id"] for query in queries], query_vectors, [row["_id"] for row in docs], doc_vectors
    )
    metrics, _ = ranking_metrics(run, {query["_id"]: benchmark.qrels[query["_id"]] for query in queries})
    return metrics["recall@1"]


def long_questions(data_root: Path | None) -> list[str]:
    """The first MeQSum training CHQs of more than :data:`LONG_WORDS` words (timing only; no test question)."""
    from medfaq.eval.summarization_data import load_pairs

    texts = [pair.chq for pair in load_pairs("meqsum:train", data_root) if len(pair.chq.split()) > LONG_WORDS]
    return texts[:LONG_QUESTIONS]


def cold_search_seconds(model: str, backend: str, benchmark: Any) -> float:
    """Median wall seconds of ``medfaq search`` in a new process over an index of `benchmark`'s corpus encoded by
    `model` on `backend` (the export made beforehand, as after set-up)."""
    from medfaq.index.encoder import load_encoder
    from medfaq.index.faq_index import FaqIndex
    from medfaq.index.records import FaqRecord

    with tempfile.TemporaryDirectory() as scratch:
        records = [FaqRecord(row["_id"], row["text"]) for row in benchmark.corpus]
        FaqIndex.build(records, load_encoder(model, backend, device="cpu"), progress=False).save(Path(scratch) / "idx")
        command = [sys.executable, "-m", "medfaq.app", "search", "--index", str(Path(scratch) / "idx")]
        command += ["--encoder-backend", backend, "is it safe to take ibuprofen with amoxicillin"]
        times = []
        for _ in range(COLD_RUNS):
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(model: str, backend: str, dev: Sequence[Any], long: list[str]) -> Candidate:
    """What the rule reads of `model` on `backend`."""
    from medfaq.eval.latency import measure as time_each
    from medfaq.index.encoder import load_encoder

    encoder = load_encoder(model, backend, device="cpu")
    per_set = {benchmark.name: development_recall(encoder, benchmark) for benchmark in dev}
    latency = time_each("encode", lambda text: encoder.encode([text]), long)
    cold = cold_search_seconds(model, backend, dev[0])
    return Candidate(model, backend, statistics.mean(per_set.values()), latency.p50_ms, cold, per_set)


def format_table(candidates: Sequence[Candidate], reasons: dict[str, str]) -> str:
    lines = [
        "| candidate | dev R@1 | per set | long p50 ms | cold search s | decision |",
        "|---|---:|---|---:|---:|---|",
    ]
    for c in candidates:
        sets = ", ".join(f"{name} {value:.1f}" for name, value in c.per_set.items())
        row = f"| {c.label} | {c.dev_recall_at_1:.1f} | {sets} | {c.long_p50_ms:.0f} | {c.cold_search_s:.2f} |"
        lines.append(f"{row} {reasons[c.label]} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m medfaq.eval.encoder_choice", description=__doc__.split("\n")[0])
    parser.add_argument("--candidate", action="append", required=True, help="MODEL:BACKEND (repeatable).")
    parser.add_argument("--dev", action="append", type=Path, required=True, help="A make-benchmark directory.")
    parser.add_argument("--data-root", type=Path, default=None, help="A copy laid out like shared/data.")
    parser.add_argument("--out", type=Path, default=None, help="Also write the JSON report here.")
    rule = EncoderRule()
    parser.add_argument("--max-long-p50-ms", type=float, default=rule.max_long_p50_ms, help="The rule's bound.")
    parser.add_argument("--max-cold-search-s", type=float, default=rule.max_cold_search_s, help="The rule's bound.")
    args = parser.parse_args(argv)
    from medfaq.eval.benchmarks import Benchmark

    rule = EncoderRule(args.max_long_p50_ms, args.max_cold_search_s)
    try:
        pairs = [spec.rpartition(":") for spec in args.candidate]
        if any(not model or not backend for model, _, backend in pairs):
            raise MedfaqError("a --candidate is MODEL:BACKEND, e.g. mpnet:onnx-int8")
        dev = [Benchmark.load(path) for path in args.dev]
        long = long_questions(args.data_root)
        candidates, refused = [], {}
        for model, _, backend in pairs:
            try:
                candidates.append(measure(model, backend, dev, long))
            except MedfaqError as error:  # e.g. an int8 graph that fails its check: reported, never chosen
                refused[f"{model}:{backend}"] = str(error)
        chosen, reasons = choose(candidates, rule)
    except MedfaqError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_table(candidates, reasons))
    for label, why in refused.items():
        print(f"not measured: {label}: {why}")
    report = {
        "rule": asdict(rule),
        "candidates": [asdict(c) for c in candidates],
        "refused": refused,
        "chosen": chosen.label,
    }
    print_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
