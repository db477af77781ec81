"""Paired comparison of two summarizers on the same questions: the difference of their mean per-question ROUGE F1
(stemmed, percent), its bootstrap confidence interval over the questions, and how many questions each side wins.

    python experiments/paired_summaries.py --a A_s0.jsonl A_s1.jsonl --b B.jsonl [--metric rouge1] [--resamples 10000]

The files are `medfaq eval summarizer --output` predictions (``id``, ``reference``, ``prediction`` per line). A side
may hold several files, e.g. one per seed: a question's score on that side is then the mean over its files.

Results: docs/experiments/summarizer.md, "Summarizer with a pretrained decoder: Gemma 3 270M (issue 13)", its
"Gemma: four epochs and 256 source tokens, ECL against MLE (seeds 0, 1, 2)"; "Gemma ECL: a final model on MeQSum
train + valid (seeds 0 and 1, averaged)"; "Gemma ECL: minimum Bayes risk decoding over the eight best beams (not
kept as the default)"; "Gemma ECL on MeQSum train + valid: the third seed, and the average of three (beam 4)";
"Gemma ECL on MeQSum train + valid: a fourth seed, and the average of four (beam 4)"; "Gemma ECL on MeQSum train +
valid with the token embedding trained (seeds 0 and 1, averaged): not better"; "Gemma: context-aware decoding
against the question-type prior (not kept as the default)"; "Gemma: length penalty, averaging a run's last two
epochs, and picking among the beams by the CHQ (none kept)"; "Gemma: the beam width, chosen on development data (3
replaces 4)"; "Gemma ECL on MeQSum train + valid, average of three seeds, beam 3: 53.97 (beam 4 stays ahead)";
"Gemma ECL against MLE on a GPU (one H200, bf16): five runs, and a memory fault found and fixed".
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from medfaq.common.runtime import MedfaqError
from medfaq.eval.script_args import positive_int
from medfaq.eval.summarization import ROUGE_TYPES, sample_rouge


def _read_predictions(path: Path) -> dict[str, tuple[str, str]]:
    """``{id: (reference, prediction)}`` of one predictions file."""
    rows: dict[str, tuple[str, str]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise MedfaqError(f"cannot read {path}: {error}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows[str(row["id"])] = (str(row["reference"]), str(row["prediction"]))
        except (ValueError, KeyError, TypeError):
            raise MedfaqError(f"{path}:{number}: not a predictions line (id, reference, prediction)") from None
    if not rows:
        raise MedfaqError(f"{path} holds no predictions")
    return rows


def side_scores(
    files: Sequence[tuple[Path, dict[str, tuple[str, str]]]], references: dict[str, str], metric: str = "rouge1"
) -> dict[str, float]:
    """Per question id: `metric` F1 in percent, averaged over the (path, predictions) files of one side (each must
    hold exactly the questions and references of `references`)."""
    totals = dict.fromkeys(references, 0.0)
    for path, rows in files:
        if {qid: reference for qid, (reference, _) in rows.items()} != references:
            raise MedfaqError(f"{path} does not hold the questions and references of the first A file")
        ids = list(rows)
        predictions = [rows[qid][1] for qid in ids]
        for qid, scores in zip(ids, sample_rouge(predictions, [references[qid] for qid in ids])):
            totals[qid] += scores[metric]
    return {qid: total / len(files) for qid, total in totals.items()}


def paired_bootstrap(
    a: Sequence[float], b: Sequence[float], resamples: int = 10_000, seed: int = 0, confidence: float = 0.95
) -> dict[str, float]:
    """Mean of a − b, its percentile bootstrap interval (questions resampled with replacement) and the counts of
    questions where a is better, worse or level."""
    differences = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if differences.size == 0:
        raise MedfaqError("no questions to compare")
    rng = np.random.default_rng(seed)
    means = differences[rng.integers(0, differences.size, size=(resamples, differences.size))].mean(axis=1)
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return {
        "difference": float(differences.mean()),
        "low": float(low),
        "high": float(high),
        "better": int((differences > 0).sum()),
        "worse": int((differences < 0).sum()),
        "level": int((differences == 0).sum()),
        "questions": int(differences.size),
    }


def compare(
    a_paths: Sequence[Path], b_paths: Sequence[Path], metric: str = "rouge1", resamples: int = 10_000, seed: int = 0
) -> dict[str, Any]:
    """Side A against side B; every file must hold the questions and references of the first A file."""
    a_files, b_files = ([(Path(path), _read_predictions(Path(path))) for path in paths] for paths in (a_paths, b_paths))
    references = {qid: reference for qid, (reference, _) in a_files[0][1].items()}
    a, b = side_scores(a_files, references, metric), side_scores(b_files, references, metric)
    ids = sorted(references)
    result = paired_bootstrap([a[qid] for qid in ids], [b[qid] for qid in ids], resamples, seed)
    means = {"a_mean": float(np.mean(list(a.values()))), "b_mean": float(np.mean(list(b.values())))}
    return {"metric": metric, **means, **result, "resamples": resamples, "seed": seed}


def format_comparison(result: dict[str, Any]) -> str:
    return (
        f"{result['metric']}: A {result['a_mean']:.2f} against B {result['b_mean']:.2f}, "
        f"difference {result['difference']:+.2f} [{result['low']:+.2f}, {result['high']:+.2f}] "
        f"(95 %, {result['resamples']} resamples, seed {result['seed']}); questions A better / worse / level: "
        f"{result['better']} / {result['worse']} / {result['level']} of {result['questions']}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python experiments/paired_summaries.py", description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, nargs="+", required=True, help="Predictions files of side A.")
    parser.add_argument("--b", type=Path, nargs="+", required=True, help="Predictions files of side B.")
    parser.add_argument("--metric", default="rouge1", choices=ROUGE_TYPES)
    parser.add_argument("--resamples", type=positive_int, default=10_000, help="Bootstrap resamples.")
    parser.add_argument("--seed", type=int, default=0, help="Bootstrap seed.")
    parser.add_argument("--json", action="store_true", help="Print one JSON object.")
    args = parser.parse_args(argv)
    try:
        result = compare(args.a, args.b, args.metric, args.resamples, args.seed)
    except MedfaqError as error:
        parser.exit(2, f"error: {error}\n")
    print(json.dumps(result) if args.json else format_comparison(result))


if __name__ == "__main__":
    main()
