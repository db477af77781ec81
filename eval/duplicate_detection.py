"""Duplicate-question detection: MQP cross-validation splits, threshold rules, metrics and evaluators.

Splits never leak across train/dev/test: ``doctor`` folds keep every doctor (pair author) in one part, as Curai
did; ``grouped`` folds keep every `question_1` group in one part. Each fold's dev part is carved from its training
part with the same grouping (at least `min_dev_groups` groups: two dev doctors instead of one measured level,
82.4 against 82.2 % with the quick cross-encoder, docs/results.md). The decision threshold follows a rule
(:data:`THRESHOLD_RULES`): a cross-encoder's own decision boundary, the one a trained model applies when deployed
(``auto``, the default for cross-encoders: a threshold tuned on one dev doctor of about 280 pairs cost a fold up to
8 points of accuracy, docs/results.md), or thresholds tuned on dev only (best F1, best accuracy) and applied to
test (``dev``, the default for bi-encoders, whose cosines have no boundary of their own).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from sklearn.metrics import accuracy_score, precision_recall_fscore_support, roc_auc_score, roc_curve
from sklearn.model_selection import GroupKFold, GroupShuffleSplit

from medfaq.common.runtime import MedfaqError
from medfaq.retriever.training.config import EncoderTrainConfig
from medfaq.retriever.training.pair_data import Pair
from medfaq.retriever.training.pair_models import PairScorer, save_trained

SPLITS = ("doctor", "grouped")
CV_FOLDS = {"quick": 3, "full": 5}
METRICS = ("accuracy", "f1", "precision", "recall", "auc")
TUNE_METRICS = ("f1", "accuracy")
THRESHOLD_RULES = ("auto", "dev", "boundary")
MIN_DEV_GROUPS = 1


@dataclass(frozen=True)
class Fold:
    """Indices into the pair list."""

    train: list[int]
    dev: list[int]
    test: list[int]


def _split_key(pair: Pair, split: str) -> str:
    key = pair.author if split == "doctor" else pair.group
    if not key:
        raise MedfaqError(f"the {split} split needs a {'author (doctor)' if split == 'doctor' else 'group'} per pair")
    return key


def make_folds(
    pairs: Sequence[Pair],
    split: str = "doctor",
    k: int = 3,
    seed: int = 0,
    dev_fraction: float = 0.15,
    min_dev_groups: int = MIN_DEV_GROUPS,
) -> list[Fold]:
    """`k` folds: test = one fold of the split's groups (doctors or `question_1` groups); dev = about
    `dev_fraction` of the remaining groups, at least `min_dev_groups` of them while one is left to train on;
    train = the rest."""
    if split not in SPLITS:
        raise MedfaqError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    groups = np.array([_split_key(pair, split) for pair in pairs])
    n_groups = len(set(groups))
    if not 2 <= k <= n_groups:
        raise MedfaqError(f"--folds must be between 2 and the number of {split} groups ({n_groups}), got {k}")
    if split == "doctor":  # few, unequal groups: GroupKFold balances the pair counts
        splitter = GroupKFold(n_splits=k)
    else:
        splitter = GroupKFold(n_splits=k, shuffle=True, random_state=seed)
    folds = []
    for i, (pool, test) in enumerate(splitter.split(np.zeros(len(pairs)), groups=groups)):
        n_pool = len(set(groups[pool]))
        n_dev = max(1, min(max(min_dev_groups, round(dev_fraction * n_pool)), n_pool - 1))
        carve = GroupShuffleSplit(n_splits=1, test_size=n_dev, random_state=seed + i)
        train, dev = next(carve.split(pool, groups=groups[pool]))
        folds.append(Fold(sorted(pool[train].tolist()), sorted(pool[dev].tolist()), sorted(test.tolist())))
    return folds


def tune_threshold(scores: np.ndarray, labels: np.ndarray, metric: str = "f1") -> float:
    """The threshold (predict 1 when score >= threshold) with the best `metric` on these (dev) scores; midway
    between neighbouring distinct scores."""
    if metric not in TUNE_METRICS:
        raise MedfaqError(f"unknown tuning metric {metric!r}; choose one of {', '.join(TUNE_METRICS)}")
    labels = np.asarray(labels)
    if len(set(labels.tolist())) < 2:
        raise MedfaqError("threshold tuning needs both labels in the dev part")
    fpr, tpr, thresholds = roc_curve(labels, scores, drop_intermediate=False)
    positives, negatives = labels.sum(), len(labels) - labels.sum()
    tp, fp = tpr * positives, fpr * negatives
    if metric == "accuracy":
        values = (tp + negatives - fp) / len(labels)
    else:
        values = np.divide(2 * tp, tp + fp + positives, out=np.zeros_like(tp), where=(tp + fp + positives) > 0)
    best = int(np.argmax(values))
    if best == 0:  # thresholds[0] is +inf: nothing predicted positive
        return float(thresholds[1]) + 1.0
    if best + 1 < len(thresholds):
        return float((thresholds[best] + thresholds[best + 1]) / 2)
    return float(thresholds[best])


def binary_metrics(scores: np.ndarray, labels: np.ndarray, threshold: float) -> dict[str, float]:
    """accuracy, precision, recall, F1 at `threshold`, and ROC AUC (threshold-free), as fractions."""
    predictions = (np.asarray(scores) >= threshold).astype(int)
    precision, recall, f1, _ = precision_recall_fscore_support(labels, predictions, average="binary", zero_division=0)
    auc = roc_auc_score(labels, scores) if len(set(np.asarray(labels).tolist())) == 2 else float("nan")
    return {
        "accuracy": float(accuracy_score(labels, predictions)),
        "precision": float(precision),
        "recall": float(recall),
        "f1": float(f1),
        "auc": float(auc),
    }


def fold_metrics(
    dev_scores: np.ndarray,
    dev_labels: np.ndarray,
    test_scores: np.ndarray,
    test_labels: np.ndarray,
    boundary: float | None = None,
) -> dict[str, float]:
    """Test metrics at `boundary` when given; else with dev-tuned thresholds: accuracy at the best-accuracy
    threshold, F1, precision and recall at the best-F1 threshold. AUC either way."""
    if boundary is None:
        threshold_f1 = tune_threshold(dev_scores, dev_labels, "f1")
        threshold_accuracy = tune_threshold(dev_scores, dev_labels, "accuracy")
    else:
        threshold_f1 = threshold_accuracy = boundary
    at_f1 = binary_metrics(test_scores, test_labels, threshold_f1)
    at_accuracy = binary_metrics(test_scores, test_labels, threshold_accuracy)
    return {
        "accuracy": at_accuracy["accuracy"],
        "f1": at_f1["f1"],
        "precision": at_f1["precision"],
        "recall": at_f1["recall"],
        "auc": at_f1["auc"],
        "threshold_f1": threshold_f1,
        "threshold_accuracy": threshold_accuracy,
    }


def summarise(per_fold: list[dict[str, float]]) -> dict[str, float]:
    """Mean and sample standard deviation (``<metric>_std``; 0 for one fold) of every number over folds."""
    summary: dict[str, float] = {}
    for key, first in per_fold[0].items():
        if not isinstance(first, int | float):
            continue
        values = np.array([fold[key] for fold in per_fold], dtype=float)
        summary[key] = float(values.mean())
        summary[f"{key}_std"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return summary


def format_table(rows: list[tuple[str, dict[str, float]]], std: bool = False) -> str:
    """Fixed-width table of METRICS (percent) per row; `std` adds ``± std`` from the ``<metric>_std`` keys."""
    width = 14 if std else 10
    lines = [f"{'':<12}" + "".join(f"{m:>{width}}" for m in METRICS)]
    for name, values in rows:
        cells = []
        for metric in METRICS:
            cell = f"{100 * values[metric]:.1f}"
            if std:
                cell += f" ± {100 * values[metric + '_std']:.1f}"
            cells.append(f"{cell:>{width}}")
        lines.append(f"{name:<12}" + "".join(cells))
    return "\n".join(lines)


def _texts(pairs: Sequence[Pair]) -> list[tuple[str, str]]:
    return [(pair.text_a, pair.text_b) for pair in pairs]


def _labels(pairs: Sequence[Pair]) -> np.ndarray:
    return np.array([pair.label for pair in pairs])


def fold_parts(pairs: Sequence[Pair], fold: Fold) -> tuple[list[Pair], list[Pair], list[Pair]]:
    """The fold's (train, dev, test) pairs."""
    train, dev, test = ([pairs[j] for j in part] for part in (fold.train, fold.dev, fold.test))
    return train, dev, test


def check_threshold_rule(rule: str, has_boundary: bool = True) -> str:
    """`rule` if it is one of :data:`THRESHOLD_RULES` and fits a model with (or without) a decision boundary of its
    own, else a one-line error."""
    if rule not in THRESHOLD_RULES:
        raise MedfaqError(f"unknown threshold rule {rule!r}; choose one of {', '.join(THRESHOLD_RULES)}")
    if rule == "boundary" and not has_boundary:
        raise MedfaqError("a bi-encoder's cosine has no decision boundary of its own; use --threshold-rule dev")
    return rule


def fold_boundary(scorer: PairScorer, rule: str) -> float | None:
    """The fixed threshold `rule` gives `scorer` (its ``decision_boundary``), or None for thresholds tuned on dev."""
    boundary = getattr(scorer, "decision_boundary", None)
    check_threshold_rule(rule, boundary is not None)
    return boundary if rule != "dev" else None


def score_fold(
    scorer: PairScorer, dev: Sequence[Pair], test: Sequence[Pair], progress: bool = False, rule: str = "auto"
) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    """:func:`fold_metrics` of `scorer` on a fold (the threshold of `rule`, see :func:`fold_boundary`, applied to
    `test`), with the dev and test scores."""
    boundary = fold_boundary(scorer, rule)
    dev_scores = scorer.score_pairs(_texts(dev), progress=progress)
    test_scores = scorer.score_pairs(_texts(test), progress=progress)
    metrics: dict[str, Any] = fold_metrics(dev_scores, _labels(dev), test_scores, _labels(test), boundary)
    metrics["threshold_rule"] = "dev" if boundary is None else "boundary"
    return metrics, dev_scores, test_scores


def write_scores(handle: TextIO, fold: int, part: str, pairs: Sequence[Pair], scores: np.ndarray) -> None:
    """One JSON line per scored pair: fold (1-based), part (dev or test), the pair and its score."""
    for pair, score in zip(pairs, scores, strict=True):
        record = {"fold": fold, "part": part, **pair.to_dict(), "score": float(score)}
        handle.write(json.dumps(record, ensure_ascii=False) + "\n")


class DuplicateEvaluator:
    """Cross-validation of a duplicate detector: ``evaluator(fit)`` trains one model per fold with
    ``fit(train_pairs, dev_pairs, fold_index) -> PairScorer`` (dev may select epochs; test is never seen), takes
    the threshold of `threshold_rule` (:func:`fold_boundary`), scores its test part, prints a table and returns
    mean/std metrics (fractions) plus ``per_fold``. With `scores_path`, every dev and test score is written there
    (:func:`write_scores`), so other threshold rules or tools can be checked on the same run."""

    def __init__(
        self,
        pairs: Sequence[Pair],
        split: str = "doctor",
        folds: int = 3,
        seed: int = 0,
        min_dev_groups: int = MIN_DEV_GROUPS,
        print_fn: Callable[[str], Any] = print,
        scores_path: Path | None = None,
        threshold_rule: str = "auto",
    ) -> None:
        self.threshold_rule = check_threshold_rule(threshold_rule)
        self.pairs = list(pairs)
        self.split = split
        self.folds = make_folds(self.pairs, split, folds, seed, min_dev_groups=min_dev_groups)
        self.print_fn = print_fn
        self.scores_path = scores_path

    def __call__(
        self,
        fit: Callable[[list[Pair], list[Pair], int], PairScorer],
        after_fold: Callable[[int, PairScorer, dict[str, float], list[Pair]], Any] | None = None,
    ) -> dict[str, Any]:
        """`after_fold(fold_index, scorer, fold_metrics, test_pairs)` runs after each fold (e.g. to save it)."""
        per_fold = []
        started = time.perf_counter()
        scores_file = self.scores_path.open("w", encoding="utf-8") if self.scores_path else contextlib.nullcontext()
        with scores_file as handle:
            for i, fold in enumerate(self.folds):
                per_fold.append(self._fold(i, fold, fit, after_fold, handle))
        summary: dict[str, Any] = summarise(per_fold)
        rows = [(f"fold {i + 1}", fold) for i, fold in enumerate(per_fold)]
        rule = per_fold[0]["threshold_rule"]
        threshold = "the model's decision boundary" if rule == "boundary" else "thresholds tuned on dev"
        self.print_fn(f"{self.split} split, {len(self.folds)} folds (test metrics, %, {threshold})")
        self.print_fn(format_table(rows))
        self.print_fn(format_table([("mean ± std", summary)], std=True))
        summary.update(split=self.split, folds=len(self.folds), total_wall_s=time.perf_counter() - started)
        summary["threshold_rule"] = rule
        summary["per_fold"] = per_fold
        return summary

    def _fold(self, i: int, fold: Fold, fit: Callable, after_fold: Callable | None, handle: TextIO | None) -> dict:
        fold_start = time.perf_counter()
        train, dev, test = fold_parts(self.pairs, fold)
        scorer = fit(train, dev, i)
        metrics, dev_scores, test_scores = score_fold(scorer, dev, test, progress=True, rule=self.threshold_rule)
        if handle is not None:
            write_scores(handle, i + 1, "dev", dev, dev_scores)
            write_scores(handle, i + 1, "test", test, test_scores)
            handle.flush()
        metrics.update(n_train=len(train), n_dev=len(dev), n_test=len(test))
        metrics["fold_wall_s"] = time.perf_counter() - fold_start
        if after_fold is not None:
            after_fold(i, scorer, metrics, test)
        self.print_fn(f"fold {i + 1}/{len(self.folds)}: " + format_table([("test", metrics)]).splitlines()[1])
        return metrics


def save_fold(
    directory: Path, model: Any, config: EncoderTrainConfig, metrics: dict[str, float], test_pairs: Sequence[Pair]
) -> None:
    """Save one fold's model with its dev-tuned thresholds (in the config's `extra`) and its test pairs as
    ``test.jsonl``, so ``medfaq eval duplicates --model DIR --pairs DIR/test.jsonl`` repeats the fold's test."""
    thresholds = {key: metrics[key] for key in ("threshold_accuracy", "threshold_f1")}
    save_trained(model, replace(config, extra={**config.extra, **thresholds}), directory)
    with (directory / "test.jsonl").open("w", encoding="utf-8") as handle:
        for pair in test_pairs:
            handle.write(json.dumps(pair.to_dict(), ensure_ascii=False) + "\n")


class PairsEvaluator:
    """Scores a fixed labelled pair set with one model at a given threshold: ``evaluator(scorer) -> metrics``."""

    def __init__(self, pairs: Sequence[Pair], threshold: float, print_fn: Callable[[str], Any] = print) -> None:
        if not pairs:
            raise MedfaqError("no pairs to evaluate")
        self.pairs = list(pairs)
        self.threshold = threshold
        self.print_fn = print_fn

    def __call__(self, scorer: PairScorer) -> dict[str, Any]:
        texts = _texts(self.pairs)
        started = time.perf_counter()
        scores = scorer.score_pairs(texts, progress=True)
        seconds = time.perf_counter() - started
        metrics: dict[str, Any] = binary_metrics(scores, _labels(self.pairs), self.threshold)
        n_texts = len({text for pair in texts for text in pair})
        metrics.update(threshold=self.threshold, n_pairs=len(texts), n_texts=n_texts, scoring_s=seconds)
        metrics.update(pairs_per_s=len(texts) / seconds, texts_per_s=n_texts / seconds)
        rate = len(texts) / seconds
        self.print_fn(f"{len(texts)} pairs ({n_texts} distinct texts) in {seconds:.1f} s: {rate:.1f} pairs/s")
        self.print_fn(f"threshold {self.threshold:g} (%)")
        self.print_fn(format_table([("pairs", metrics)]))
        return metrics
