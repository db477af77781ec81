"""Before and after `medfaq index adapt` on retrieval benchmarks: each part alone (applied whatever the rule says),
all parts together, and what the rule keeps; R@1, R@5, MRR@10 on each benchmark's judged test queries, and where a
benchmark has out-of-scope questions the abstention AUROC and answer-or-abstain accuracy at its dev-calibrated
threshold.

    python -m medfaq.eval.adaptation_gain BENCH_DIR... [--variant rule] [--seed 0] [--json OUT]

Each BENCH_DIR is written by `medfaq data make-benchmark NAME --out BENCH_DIR` (its index in BENCH_DIR/index). The
index is adapted and undone in place, one variant after another; the generated questions are cached beside it, so
only the first variant writes them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from medfaq.common.runtime import MedfaqError
from medfaq.eval.benchmarks import Benchmark
from medfaq.eval.retrieval import RetrievalEvaluator, run_pipeline
from medfaq.eval.script_args import print_report
from medfaq.retriever import adaptation
from medfaq.retriever.adaptation_config import PARTS, AdaptConfig

VARIANTS: dict[str, dict[str, Any]] = {
    "answers": {"parts": ["answers"], "force": True},
    "phrasings": {"parts": ["phrasings"], "force": True},
    "phrasings-unfiltered": {"parts": ["phrasings"], "force": True, "round_trip_depth": 0},
    "encoder": {"parts": ["encoder"], "force": True},
    "encoder-hard": {"parts": ["encoder"], "force": True, "encoder_labels": "hard"},
    "all": {"parts": list(PARTS), "force": True},
    "rule": {"parts": list(PARTS), "force": False},
}
COLUMNS = ("recall@1", "recall@5", "mrr@10", "auroc", "selective_acc")


def test_metrics(bench_dir: Path, benchmark: Benchmark) -> dict[str, float]:
    """The index's own pipeline (abstention and logging off) on the benchmark's queries."""
    from dataclasses import replace

    from medfaq.retriever.model_cache import open_pipeline
    from medfaq.retriever.pipeline_file import read_config

    index = bench_dir / "index"
    config = replace(read_config(index), abstain=False, log_unanswered=False, entities=False)
    pipeline = open_pipeline(index, config)
    queries = {query["_id"]: query["text"] for query in benchmark.queries}
    run, confidences, _ = run_pipeline(pipeline, queries, progress=False)
    return RetrievalEvaluator(benchmark.qrels, benchmark.ood_ids, benchmark.dev_ids)(run, confidences)


def measure(bench_dir: Path, variants: list[str], seed: int, questions: int, depth: int) -> dict[str, Any]:
    """The unadapted index's metrics, then each variant's (adapted, scored, undone)."""
    benchmark = Benchmark.load(bench_dir)
    index = bench_dir / "index"
    if adaptation.adaptation_of(index):
        raise MedfaqError(f"{index} is adapted already; undo it first (`medfaq index adapt {index} --undo`)")
    report: dict[str, Any] = {"benchmark": benchmark.name, "none": {"test": test_metrics(bench_dir, benchmark)}}
    for variant in variants:
        settings = {"questions_per_faq": questions, "round_trip_depth": depth, "seed": seed, **VARIANTS[variant]}
        config = AdaptConfig(**settings)
        started = time.perf_counter()
        record = adaptation.adapt(index, config, progress=False, log=lambda line: print(line, file=sys.stderr))
        report[variant] = {
            "test": test_metrics(bench_dir, benchmark),
            "applied": record["applied"],
            "before": record["before"],
            "parts": record["parts"],
            "round_trip": record["round_trip"],
            "seconds": round(time.perf_counter() - started, 1),
        }
        adaptation.undo(index)
    return report


def print_table(reports: list[dict[str, Any]]) -> None:
    print("| benchmark | variant | applied | " + " | ".join(COLUMNS) + " |")
    print("|---|---|---|" + "---:|" * len(COLUMNS))
    for report in reports:
        for variant, result in report.items():
            if variant == "benchmark":
                continue
            cells = " | ".join(f"{result['test'][c]:.1f}" if c in result["test"] else "" for c in COLUMNS)
            applied = ", ".join(result.get("applied", [])) or "-"
            print(f"| {report['benchmark']} | {variant} | {applied} | {cells} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m medfaq.eval.adaptation_gain", description=__doc__.splitlines()[0])
    parser.add_argument("benchmarks", type=Path, nargs="+", help="benchmark directories (with an index/ inside)")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS), help="default: every variant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--questions", type=int, default=AdaptConfig.questions_per_faq, help="written per FAQ")
    parser.add_argument("--depth", type=int, default=AdaptConfig.round_trip_depth, help="the round trip's top k")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    try:
        reports = [
            measure(path.expanduser(), args.variant or list(VARIANTS), args.seed, args.questions, args.depth)
            for path in args.benchmarks
        ]
    except MedfaqError as error:
        sys.exit(f"error: {error}")
    print_report({"seed": args.seed, "reports": reports}, args.json)
    print_table(reports)


if __name__ == "__main__":
    main()
