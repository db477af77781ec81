"""The default retrieval encoder, chosen by a rule written before any candidate was measured.

The rule (:class:`retriever.decisions.encoder_rule.EncoderRule`, which `--encoder auto` applies too): among the
candidates (an encoder on a backend) whose median time to encode one long consumer question (more than 60 words) is at
most 200 ms and whose cold ``medfaq search`` (a new process searching a small index once) takes at most 1.5 s of wall
time on 2 CPU cores, the default is the one with the best development quality; quality is the mean Recall@1 of dense
search over the development halves of the real FAQ banks (covid-q, quebec, medquad-rqe), never a test half and
never a summary-matching set. Candidates within 0.5 R@1 of the best count as equal, and the fastest of them
(long-question p50) wins.

The times are medians over `--rounds` rounds (each round times every candidate in turn, `--gap-s` apart), since a
shared 2-core machine measured the same graph at 98 and at 271 ms on two runs of one day: a single round lets the
hour decide. Quality is measured once (it does not vary).

``measure`` loads each candidate and scores it, ``time_round`` times them all once, ``choose`` applies the rule to
the numbers it is given:

    python experiments/encoder_choice.py --candidate minilm:onnx --candidate mpnet:onnx --candidate mpnet:onnx-int8 \\
        --dev bench/covid-q --dev bench/quebec --dev bench/medquad-rqe --rounds 5 --out encoder_choice.json

Results: docs/experiments/biencoder.md, "The strongest encoder we can ship (issue 52, first part): stock encoders,
covid-q, and one distilled student", its "The default encoder's rule, run: fine-tuned MPNet on ONNX Runtime fp32
(not yet what set-up trains)", "Set-up ships the chosen encoder: fine-tuned MPNet encodes the MedQuAD index (issue
52)" and "The rule over seven rounds, and a one-question search without pre-packed weights: fine-tuned MPNet
confirmed" (and the package's retriever/stock_encoders.json).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from medfaq.common.runtime import MedfaqError
from medfaq.eval.script_args import print_report
from medfaq.retriever.decisions.encoder_rule import Candidate, EncoderRule, choose

LONG_WORDS = 60  # a long consumer question: more than this many words
LONG_QUESTIONS = 50  # MeQSum training CHQs timed per candidate
COLD_RUNS = 3  # cold searches per candidate per round


def development_recall(encoder: Any, benchmark: Any) -> float:
    """R@1 (%) of exact cosine search over `benchmark`'s corpus for its development queries: those marked ``dev``,
    or all judged ones where the benchmark is itself a validation set (none marked)."""
    from medfaq.common.ranking import ranking_metrics
    from medfaq.eval.retrieval import exact_search_run

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


def cold_search_seconds(index: Path, backend: str) -> list[float]:
    """Wall seconds of :data:`COLD_RUNS` runs of ``medfaq search`` for one question, each in a new process, over
    `index` on `backend` (its export made beforehand, as after set-up)."""
    command = [sys.executable, "-m", "medfaq.app", "search", "--index", str(index)]
    command += ["--encoder-backend", backend, "is it safe to take ibuprofen with amoxicillin"]
    times = []
    for _ in range(COLD_RUNS):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


@dataclass
class Measured:
    """A candidate's scores with what its timing rounds need: the loaded encoder and a small index it encoded."""

    candidate: Candidate
    encoder: Any
    index: Path


def measure(model: str, backend: str, dev: Sequence[Any], index: Path) -> Measured:
    """Score `model` on `backend` on the development sets and save at `index` the first set's corpus encoded by
    it, for the cold searches."""
    from medfaq.index.encoder import load_encoder
    from medfaq.index.faq_index import FaqIndex
    from medfaq.index.records import FaqRecord

    encoder = load_encoder(model, backend, device="cpu")
    per_set = {benchmark.name: development_recall(encoder, benchmark) for benchmark in dev}
    records = [FaqRecord(row["_id"], row["text"]) for row in dev[0].corpus]
    FaqIndex.build(records, encoder, progress=False).save(index)
    return Measured(Candidate(model, backend, statistics.mean(per_set.values()), per_set=per_set), encoder, index)


def time_round(measured: Sequence[Measured], long: list[str]) -> None:
    """One round: each candidate in turn encodes the long questions one at a time (its p50) and answers
    :data:`COLD_RUNS` cold searches."""
    from medfaq.eval.latency import measure as time_each

    for item in measured:
        latency = time_each("encode", lambda text, encoder=item.encoder: encoder.encode([text]), long)
        item.candidate.add_round(latency.p50_ms, cold_search_seconds(item.index, item.candidate.backend))


def format_table(candidates: Sequence[Candidate], reasons: dict[str, str]) -> str:
    """The rule's table: the medians it read, with each timing's range over the rounds."""
    lines = [
        "| candidate | dev R@1 | per set | long p50 ms (range) | cold search s (range) | decision |",
        "|---|---:|---|---:|---:|---|",
    ]
    for c in candidates:
        sets = ", ".join(f"{name} {value:.1f}" for name, value in c.per_set.items())
        long = f"{c.long_p50_ms:.0f} ({min(c.long_p50_rounds):.0f}-{max(c.long_p50_rounds):.0f})"
        cold = f"{c.cold_search_s:.2f} ({min(c.cold_search_runs):.2f}-{max(c.cold_search_runs):.2f})"
        lines.append(f"| {c.label} | {c.dev_recall_at_1:.1f} | {sets} | {long} | {cold} | {reasons[c.label]} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python experiments/encoder_choice.py", description=__doc__.split("\n")[0])
    parser.add_argument("--candidate", action="append", required=True, help="MODEL:BACKEND (repeatable).")
    parser.add_argument("--dev", action="append", type=Path, required=True, help="A make-benchmark directory.")
    parser.add_argument("--data-root", type=Path, default=None, help="A copy laid out like shared/data.")
    parser.add_argument("--out", type=Path, default=None, help="Also write the JSON report here.")
    parser.add_argument("--rounds", type=int, default=3, help="Timing rounds; the rule reads their medians.")
    parser.add_argument("--gap-s", type=float, default=0.0, help="Seconds to wait between rounds.")
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
        if args.rounds < 1:
            raise MedfaqError("--rounds must be at least 1")
        dev = [Benchmark.load(path) for path in args.dev]
        long = long_questions(args.data_root)
        measured, refused = [], {}
        with tempfile.TemporaryDirectory() as scratch:
            for number, (model, _, backend) in enumerate(pairs):
                try:
                    measured.append(measure(model, backend, dev, Path(scratch) / f"index-{number}"))
                except MedfaqError as error:  # e.g. an int8 graph that fails its check: reported, never chosen
                    refused[f"{model}:{backend}"] = str(error)
            for round_number in range(args.rounds):
                if round_number:
                    time.sleep(args.gap_s)
                time_round(measured, long)
        candidates = [item.candidate for item in measured]
        chosen, reasons = choose(candidates, rule)
    except MedfaqError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_table(candidates, reasons))
    for label, why in refused.items():
        print(f"not measured: {label}: {why}")
    report = {
        "rule": asdict(rule),
        "rounds": args.rounds,
        "candidates": [asdict(c) for c in candidates],
        "refused": refused,
        "chosen": chosen.label,
    }
    print_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
