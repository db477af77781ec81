"""How well the experts' queue groups questions (retriever/queue/question_queue.py), and how long adding one takes.

1. MQP pairs: the "same question" decision on each (question 1, question 2) pair: the duplicate detector's score
   (or, with ``--detector none``, the bi-encoder's cosine). The decision threshold is chosen on a development half
   of the MQP groups (seeded) by one rule written before scoring: the threshold with the best F1 there (ties: the
   higher); precision, recall, F1 and accuracy are reported on the other half.
2. Quebec COVID FAQ training paraphrases: ``--quebec N`` in-scope questions (seeded sample, seeded order) queued
   one by one into an empty queue at that threshold; the groups are compared with the 313 FAQs the questions are
   paraphrases of: number of groups and of FAQs, purity (each group's most common FAQ), inverse purity (each FAQ's
   most common group), pairwise precision/recall/F1 of "same group" against "same FAQ", adjusted Rand index.
3. ``--timing-queue N``: milliseconds to add one question to a queue already holding N questions (median and p95
   of 20 adds; the queue is filled with the Quebec questions, repeated with a counter where N is larger).

Reads MQP and the Quebec set fetched with `medfaq data fetch mqp|quebec`, or from ``--data ../shared/data``.

    python -m medfaq.eval.queue_grouping [--encoder NAME] [--detector NAME|none] [--data DIR] [--quebec N]
        [--timing-queue N] [--seed S] [--json report.json]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from medfaq.common.runtime import MedfaqError
from medfaq.eval.script_args import int_at_least, print_report
from medfaq.index.pair_sources import load_jsonl_rows, load_mqp
from medfaq.retriever.queue.question_queue import GroupingSettings, QuestionQueue

TIMED_ADDS = 20


def pair_scores(pairs: list[dict[str, Any]], encoder: Any, detector: Any) -> np.ndarray:
    """The "same question" score of each MQP pair: the detector's, else the cosine of the two vectors."""
    if detector is not None:
        return np.array([detector.score(p["question_1"], [p["question_2"]])[0] for p in pairs], dtype=np.float64)
    first = encoder.encode([p["question_1"] for p in pairs])
    second = encoder.encode([p["question_2"] for p in pairs])
    return np.sum(first * second, axis=1).astype(np.float64)


def decisions(labels: np.ndarray, decided: np.ndarray) -> dict[str, float]:
    true_positive = float(np.sum(decided & labels))
    precision = true_positive / max(float(decided.sum()), 1.0)
    recall = true_positive / max(float(labels.sum()), 1.0)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "accuracy": float(np.mean(decided == labels))}


def best_threshold(scores: np.ndarray, labels: np.ndarray) -> float:
    """The threshold (one of the scores) with the best F1 on these pairs; ties: the higher threshold."""
    best, best_f1 = float(scores.max()), -1.0
    for threshold in sorted(set(scores.tolist()), reverse=True):
        f1 = decisions(labels, scores >= threshold)["f1"]
        if f1 > best_f1:
            best, best_f1 = threshold, f1
    return best


def mqp_report(
    data: Path | None, encoder: Any, detector: Any, seed: int, threshold: float | None = None
) -> dict[str, Any]:
    """The "same question" decision on the MQP pairs at `threshold` (None: the development half's best F1)."""
    pairs = load_mqp(data)
    groups = sorted({pair["group_id"] for pair in pairs})
    development = set(random.Random(seed).sample(groups, len(groups) // 2))
    scores = pair_scores(pairs, encoder, detector)
    labels = np.array([pair["label"] == 1 for pair in pairs])
    dev = np.array([pair["group_id"] in development for pair in pairs])
    if threshold is None:
        threshold = best_threshold(scores[dev], labels[dev])
    return {
        "threshold": threshold,
        "development_pairs": int(dev.sum()),
        "test_pairs": int((~dev).sum()),
        "development": decisions(labels[dev], scores[dev] >= threshold),
        "test": decisions(labels[~dev], scores[~dev] >= threshold),
    }


def quebec_questions(data: Path | None, count: int, seed: int) -> list[tuple[str, int]]:
    rows = [row for row in load_jsonl_rows("quebec", "train.jsonl", data) if not row["is_ood"]]
    chosen = random.Random(seed).sample(rows, min(count, len(rows)))
    return [(row["question"], int(row["passage_id"])) for row in chosen]


def grouping_report(groups: list[int], labels: list[int]) -> dict[str, Any]:
    """Queue groups against the FAQs the questions paraphrase (see the module docstring)."""
    from sklearn.metrics import adjusted_rand_score

    by_group = Counter(groups)
    pair_counts = Counter(zip(groups, labels, strict=True))
    purity = sum(max(n for (g, _), n in pair_counts.items() if g == group) for group in by_group) / len(groups)
    by_label = Counter(labels)
    inverse = sum(max(n for (_, lab), n in pair_counts.items() if lab == label) for label in by_label) / len(labels)
    same_both = sum(n * (n - 1) / 2 for n in pair_counts.values())
    same_group = sum(n * (n - 1) / 2 for n in by_group.values())
    same_label = sum(n * (n - 1) / 2 for n in by_label.values())
    precision, recall = same_both / max(same_group, 1), same_both / max(same_label, 1)
    return {
        "questions": len(groups),
        "groups": len(by_group),
        "faqs": len(by_label),
        "purity": purity,
        "inverse_purity": inverse,
        "pairwise_precision": precision,
        "pairwise_recall": recall,
        "pairwise_f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "adjusted_rand": float(adjusted_rand_score(labels, groups)),
    }


def timing_report(queue: QuestionQueue, questions: list[str], size: int) -> dict[str, float]:
    """Fill `queue` to `size` questions, then time `TIMED_ADDS` more adds."""
    from tqdm.auto import tqdm

    for number in tqdm(range(size), desc="filling the queue", unit="question"):
        text = questions[number % len(questions)]
        queue.add(text if number < len(questions) else f"{text} ({number // len(questions)})")
    times = []
    for text in questions[:TIMED_ADDS]:
        start = time.perf_counter()
        queue.add(f"{text} again")
        times.append((time.perf_counter() - start) * 1000)
    return {"queue_size": size, "median_ms": float(np.median(times)), "p95_ms": float(np.percentile(times, 95))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m medfaq.eval.queue_grouping", description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", default="auto", help="bi-encoder (auto: the set-up one, else minilm)")
    parser.add_argument("--detector", default="none", help="duplicate detector: a cross-encoder, or none")
    parser.add_argument("--data", type=Path, default=None, help="data laid out as ../shared/data (default: fetched)")
    parser.add_argument("--quebec", type=int_at_least(2), default=2000, help="Quebec questions to group")
    parser.add_argument("--timing-queue", type=int_at_least(0), default=0, help="queue size for the timing (0: none)")
    parser.add_argument(
        "--threshold-rule",
        choices=("dev", "boundary"),
        default="dev",
        help="dev: the best F1 on the MQP development half; boundary: the detector's own decision boundary (a "
        "detector trained on MQP has seen the MQP pairs, so its MQP figures are not a test)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    try:
        report = run(args)
    except MedfaqError as error:
        sys.exit(f"error: {error}")
    print_report(report, args.json)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from medfaq.index.encoder import load_encoder
    from medfaq.retriever.trained_models import choose_encoder

    encoder = load_encoder(choose_encoder(args.encoder))
    detector = None
    if args.detector != "none":
        from medfaq.retriever.model_cache import shared_cache
        from medfaq.retriever.pipeline import PipelineConfig

        detector = shared_cache().stage("rerank", args.detector, PipelineConfig(rerank=True, reranker=args.detector))
    if args.threshold_rule == "boundary" and detector is None:
        raise MedfaqError("--threshold-rule boundary needs a --detector")
    boundary = float(detector.decision_boundary) if args.threshold_rule == "boundary" else None
    mqp = mqp_report(args.data, encoder, detector, args.seed, boundary)
    settings = GroupingSettings(threshold=mqp["threshold"], same_cosine=mqp["threshold"])
    report: dict[str, Any] = {
        "encoder": encoder.name,
        "detector": args.detector,
        "threshold_rule": args.threshold_rule,
        "seed": args.seed,
        "mqp": mqp,
    }
    questions = quebec_questions(args.data, args.quebec, args.seed)
    with tempfile.TemporaryDirectory(prefix="medfaq-queue-") as scratch:
        queue = QuestionQueue(Path(scratch) / "queue.sqlite3", encoder, detector, settings=settings)
        groups = [queue.add(text).group_id for text, _ in tqdm(questions, desc="grouping", unit="question")]
        report["quebec"] = grouping_report(groups, [label for _, label in questions])
        if args.timing_queue:
            timed = QuestionQueue(Path(scratch) / "timed.sqlite3", encoder, detector, settings=settings)
            report["timing"] = timing_report(timed, [text for text, _ in questions], args.timing_queue)
    return report


if __name__ == "__main__":
    main()
