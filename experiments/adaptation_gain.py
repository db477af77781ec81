"""Before and after `medfaq index adapt` on retrieval benchmarks: each part alone (applied whatever the rule says),
all parts together, and what the rule keeps; R@1, R@5, MRR@10 on each benchmark's judged test queries, and where a
benchmark has out-of-scope questions the abstention AUROC and answer-or-abstain accuracy at its dev-calibrated
threshold.

    python experiments/adaptation_gain.py BENCH_DIR... [--variant rule] [--seed 0] [--labelled-dev] [--json OUT]

Each BENCH_DIR is written by `medfaq data make-benchmark NAME --out BENCH_DIR` (its index in BENCH_DIR/index). The
index is adapted and undone in place, one variant after another; the generated questions are cached beside it, so
only the first variant writes them. `--labelled-dev`: the benchmark's development queries (those it holds out of
its test metrics, e.g. Quebec's dev half) are the user's labelled development queries (`--dev-queries`).
Variants `answer-rows` and `answer-head-rows` add the rows the `answers` part adds (with and without the question
before the answer's head) with no question written and no rule: they need no question writer.

Results:

* docs/experiments/adaptation.md, "medfaq learns your bank (issue 53): questions written for each FAQ, the round
  trip, and the per-bank rule"
* docs/experiments/adaptation.md, "medfaq learns your bank over MPNet: meqsum, and the time a 1,000-FAQ bank takes
  (issue 53)"
* docs/experiments/adaptation.md, "Generated questions alone keep only the answer rows (issue 53: never below on any
  bank)"
* docs/experiments/adaptation.md, "The answer's head after its question, and writing only for the development sample
  (issue 53)"
* docs/experiments/adaptation.md, "Answer rows on a sample of MedQuAD: the rule kept them and medquad-chq lost;
  judged now on the FAQs they skip (issue 53)"
* docs/experiments/adaptation.md, "`index adapt` over the fine-tuned MPNet it ships with: a MedQuAD sample, three
  seeds on COVID-Q and Quebec (issue 53)"
* docs/experiments/setup.md, "A fresh set-up of the MPNet pipeline, and a second set of three rank seeds (issue
  54)", its "`index adapt` over the set-up's fine-tuned MPNet: COVID-Q and Quebec with both answer rows (issue 53)"
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
from medfaq.retriever.decisions import adaptation
from medfaq.retriever.decisions.adaptation import DevQuery, NothingToAdapt
from medfaq.retriever.decisions.adaptation_config import PARTS, AdaptConfig

VARIANTS: dict[str, dict[str, Any]] = {
    "answers": {"parts": ["answers"], "force": True},
    "phrasings": {"parts": ["phrasings"], "force": True},
    "phrasings-unfiltered": {"parts": ["phrasings"], "force": True, "round_trip_depth": 0},
    "encoder": {"parts": ["encoder"], "force": True},
    "encoder-hard": {"parts": ["encoder"], "force": True, "encoder_labels": "hard"},
    "all": {"parts": list(PARTS), "force": True},
    "rule": {"parts": list(PARTS), "force": False},
}
ROWS_ONLY = {"answer-rows": True, "answer-head-rows": False}  # variant: AdaptConfig.answer_with_question
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


def answer_rows_metrics(bench_dir: Path, benchmark: Benchmark, with_question: bool) -> dict[str, Any]:
    """Test metrics with the rows of the `answers` part added as `adapt` adds them, nothing written or decided; the
    rows are removed after."""
    from medfaq.index.faq_index import FaqIndex

    directory = bench_dir / "index"
    index = FaqIndex.load(directory)
    rows = adaptation.answer_rows(index.records(), AdaptConfig.answer_words, with_question)
    keys = adaptation.add_rows(index, rows, adaptation.ORIGINS["answers"], progress=True)
    index.save(directory)
    try:
        return {"test": test_metrics(bench_dir, benchmark), "applied": ["answers"] if keys else [], "rows": len(keys)}
    finally:
        if keys:
            adaptation.remove_rows(index, keys)
        index.save(directory)


def labelled_dev(benchmark: Benchmark) -> list[DevQuery]:
    """The benchmark's judged development queries, as a user's labelled ones; none is a one-line error."""
    texts = benchmark.query_texts()
    golds = {q: frozenset(d for d, rel in docs.items() if rel > 0) for q, docs in benchmark.qrels.items()}
    queries = [DevQuery(texts[q], golds[q]) for q in sorted(benchmark.dev_ids) if golds.get(q)]
    if not queries:
        raise MedfaqError(f"benchmark {benchmark.name} has no judged development queries for --labelled-dev")
    return queries


def measure(
    bench_dir: Path, variants: list[str], seed: int, questions: int, depth: int, labelled: bool = False
) -> dict[str, Any]:
    """The unadapted index's metrics, then each variant's (adapted, scored, undone); `labelled`: with the
    benchmark's development queries as the user's."""
    benchmark = Benchmark.load(bench_dir)
    index = bench_dir / "index"
    if adaptation.adaptation_of(index):
        raise MedfaqError(f"{index} is adapted already; undo it first (`medfaq index adapt {index} --undo`)")
    user_dev = labelled_dev(benchmark) if labelled else []
    report: dict[str, Any] = {
        "benchmark": benchmark.name,
        "labelled_dev": len(user_dev),
        "none": {"test": test_metrics(bench_dir, benchmark)},
    }
    for variant in variants:
        if variant in ROWS_ONLY:
            report[variant] = answer_rows_metrics(bench_dir, benchmark, ROWS_ONLY[variant])
            continue
        settings = {"questions_per_faq": questions, "round_trip_depth": depth, "seed": seed, **VARIANTS[variant]}
        config = AdaptConfig(**settings)
        started = time.perf_counter()
        try:
            record = adaptation.adapt(
                index, config, user_dev, progress=False, log=lambda line: print(line, file=sys.stderr)
            )
        except NothingToAdapt as error:  # nothing this variant may try on this bank: the index stays as built
            report[variant] = {"test": report["none"]["test"], "applied": [], "why": str(error)}
            continue
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
            if not isinstance(result, dict):
                continue
            cells = " | ".join(f"{result['test'][c]:.1f}" if c in result["test"] else "" for c in COLUMNS)
            applied = ", ".join(result.get("applied", [])) or "-"
            print(f"| {report['benchmark']} | {variant} | {applied} | {cells} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python experiments/adaptation_gain.py", description=__doc__.splitlines()[0])
    parser.add_argument("benchmarks", type=Path, nargs="+", help="benchmark directories (with an index/ inside)")
    parser.add_argument(
        "--variant", action="append", choices=[*VARIANTS, *ROWS_ONLY], help="default: every variant that writes"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--questions", type=int, default=AdaptConfig.questions_per_faq, help="written per FAQ")
    parser.add_argument("--depth", type=int, default=AdaptConfig.round_trip_depth, help="the round trip's top k")
    parser.add_argument(
        "--labelled-dev", action="store_true", help="the benchmark's development queries as the user's labelled ones"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    try:
        reports = [
            measure(
                path.expanduser(),
                args.variant or list(VARIANTS),
                args.seed,
                args.questions,
                args.depth,
                args.labelled_dev,
            )
            for path in args.benchmarks
        ]
    except MedfaqError as error:
        sys.exit(f"error: {error}")
    print_report({"seed": args.seed, "labelled_dev": args.labelled_dev, "reports": reports}, args.json)
    print_table(reports)


if __name__ == "__main__":
    main()
