"""How well a benchmark index abstains at the threshold in its ``pipeline.json`` (inherited from its encoder, or
calibrated on it): in-scope questions answered, out-of-scope ones abstained on, and AUROC of the confidence.

For each benchmark directory (`medfaq data make-benchmark`), the judged questions of one split (``test``: the
questions outside ``dev.txt``; ``dev``: those in it) are in scope. Out of scope are the split's ``ood`` questions
where the benchmark has them (Quebec: HealthTap questions), and, for every benchmark, the in-scope questions searched
again after their gold FAQs (and FAQs within cosine 0.9 of one) are deleted from the index
(:func:`retriever.decisions.abstention.without_answers`, the construction the threshold was calibrated with). Nothing is
calibrated here: the threshold is the one the index starts with.

    python experiments/inherited_threshold.py BENCH_DIR [BENCH_DIR ...] [--split test|dev] [--json report.json]

Results: docs/experiments/abstention-and-queue.md, "Abstention out of the box: a threshold calibrated with the
encoder, inherited by every new index".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from medfaq.common.ranking import read_qrels
from medfaq.common.runtime import MedfaqError
from medfaq.eval.benchmarks import read_beir_queries
from medfaq.eval.script_args import print_report
from medfaq.retriever.decisions.abstention import at_threshold, without_answers
from medfaq.retriever.model_cache import build_pipeline
from medfaq.retriever.pipeline import Pipeline
from medfaq.retriever.pipeline_file import read_config

SPLITS = ("test", "dev")
BATCH = 64


def confidences(pipeline: Pipeline, texts: list[str]) -> list[float | None]:
    """The pipeline's confidence for each question (in batches)."""
    found: list[float | None] = []
    for start in range(0, len(texts), BATCH):
        found += [response.confidence for response in pipeline.run_batch(texts[start : start + BATCH])]
    return found


def measure(benchmark: Path, split: str = "test") -> dict[str, Any]:
    """The abstention figures of one benchmark directory at its index's threshold (see the module docstring)."""
    from medfaq.index.faq_index import FaqIndex

    rows = read_beir_queries(benchmark / "queries.jsonl")
    qrels = read_qrels(benchmark / "qrels.tsv")
    wanted = [row for row in rows if (row["metadata"].get("split") == "dev") == (split == "dev")]
    in_scope = [row for row in wanted if row["_id"] in qrels and not row["metadata"].get("ood")]
    ood = [row for row in wanted if row["metadata"].get("ood")]
    config = read_config(benchmark / "index").updated(entities=False, log_unanswered=False)
    threshold = config.active_threshold()
    if not config.abstain or threshold is None:
        raise MedfaqError(f"{benchmark / 'index'} has no abstention threshold for {config.threshold_key}")
    index = FaqIndex.load(benchmark / "index")
    pipeline = build_pipeline(index, config.updated(abstain=False))
    answerable = confidences(pipeline, [row["text"] for row in in_scope])
    real_ood = confidences(pipeline, [row["text"] for row in ood])
    golds = [index.get(doc).question for row in in_scope for doc in qrels[row["_id"]] if doc in index]
    removed = without_answers(index, golds)
    unanswerable = confidences(pipeline, [row["text"] for row in in_scope])
    report: dict[str, Any] = {
        "benchmark": benchmark.name,
        "split": split,
        "threshold": threshold,
        "key": config.threshold_key,
        "inherited_from": config.inherited_thresholds.get(config.threshold_key),
        "in_scope": len(in_scope),
        "removed_faqs": removed,
        "answers_removed": at_threshold(
            [True] * len(answerable) + [False] * len(unanswerable), answerable + unanswerable, threshold
        ),
    }
    if ood:
        report["ood"] = len(ood)
        report["real_ood"] = at_threshold(
            [True] * len(answerable) + [False] * len(real_ood), answerable + real_ood, threshold
        )
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python experiments/inherited_threshold.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("benchmarks", nargs="+", type=Path, help="benchmark directories (with an index/)")
    parser.add_argument("--split", choices=SPLITS, default="test")
    parser.add_argument("--json", type=Path, default=None, help="also write the reports to this file")
    args = parser.parse_args(argv)
    try:
        reports = [measure(directory, args.split) for directory in args.benchmarks]
    except MedfaqError as error:
        sys.exit(f"error: {error}")
    print_report({"benchmarks": reports}, args.json)


if __name__ == "__main__":
    main()
