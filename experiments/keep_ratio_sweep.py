"""WiSE-FT keep-ratio sweep on MQP cross-validation: each fold's model is trained once per seed (keep ratio 1),
then scored at every keep ratio with its weights moved back towards the start, with the threshold rule of
``medfaq eval duplicates`` (``--threshold-rule``). The folds are those of ``--fold-seed``, so the seeds vary the
training only. Prints accuracy, F1 and ROC AUC per ratio (mean ± std over the seeds of each seed's fold mean).

    python experiments/keep_ratio_sweep.py --model-type crossencoder --seeds 0,1,2 --ratios 1,0.75,0.5,0.25

Results: docs/experiments/duplicate-detection.md, "Cross-encoder training that learns (MQP duplicate detection)",
its "Keeping part of the fine-tuning change (WiSE-FT): +1.7 points on fixed folds, 84 % not reached by every seed"
and "MQP sibling negatives: each question's two rewrites as one more negative (seed 0, not kept)".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from medfaq.common.runtime import MedfaqError
from medfaq.eval.duplicate_detection import (
    METRICS,
    MIN_DEV_GROUPS,
    THRESHOLD_RULES,
    fold_parts,
    format_table,
    make_folds,
    score_fold,
    summarise,
)
from medfaq.eval.script_args import int_at_least, positive_int
from medfaq.retriever.training.config import make_config
from medfaq.retriever.training.loop import copy_weights, interpolate_weights
from medfaq.retriever.training.pair_data import Pair, mqp_pairs
from medfaq.retriever.training.pair_models import as_scorer, initial_weights, train_pair_model


def keep_ratio_sweep(
    pairs: Sequence[Pair],
    model_type: str = "crossencoder",
    preset: str = "quick",
    init: str = "minilm",
    seeds: Sequence[int] = (0,),
    ratios: Sequence[float] = (1.0, 0.75, 0.5),
    split: str = "doctor",
    folds: int = 3,
    fold_seed: int = 0,
    min_dev_groups: int = MIN_DEV_GROUPS,
    device: str | None = None,
    overrides: dict[str, Any] | None = None,
    print_fn: Callable[[str], Any] = print,
    threshold_rule: str = "auto",
) -> dict[str, Any]:
    """`overrides`: preset settings to change (e.g. ``{"lr": 1e-4}``). Per ratio (``"0.75"``): the mean and
    ``<metric>_std`` over seeds of each seed's fold-mean metrics (fractions), and ``per_seed``."""
    pairs = list(pairs)
    per_fold: dict[float, dict[int, list[dict[str, float]]]] = {ratio: {seed: [] for seed in seeds} for ratio in ratios}
    for seed in seeds:
        for index, fold in enumerate(make_folds(pairs, split, folds, fold_seed, min_dev_groups=min_dev_groups)):
            train, dev, test = fold_parts(pairs, fold)
            settings = {**(overrides or {}), "keep_ratio": 1.0}
            config = make_config(model_type, "mqp", preset, init=init, seed=seed, **settings)
            model = train_pair_model(train, config, device, dev)
            tuned = copy_weights(model)
            start = initial_weights(train, replace(config), device)
            for ratio in ratios:
                model.load_state_dict(tuned)
                interpolate_weights(model, start, ratio)
                metrics = score_fold(as_scorer(model, config), dev, test, rule=threshold_rule)[0]
                per_fold[ratio][seed].append(metrics)
                print_fn(f"seed {seed} fold {index + 1} keep {ratio:g}: accuracy {100 * metrics['accuracy']:.1f}")
    summary: dict[str, Any] = {"model_type": model_type, "preset": preset, "seeds": list(seeds), "ratios": {}}
    for ratio in ratios:
        seed_means = [{m: float(np.mean([f[m] for f in per_fold[ratio][seed]])) for m in METRICS} for seed in seeds]
        summary["ratios"][f"{ratio:g}"] = {**summarise(seed_means), "per_seed": seed_means}
    seed_list = ", ".join(map(str, seeds))
    print_fn(f"{split} split, {folds} folds, seeds {seed_list} (test metrics, %, mean ± std over seeds)")
    print_fn(format_table([(f"keep {ratio}", summary["ratios"][ratio]) for ratio in summary["ratios"]], std=True))
    return summary


def _seeds(text: str) -> list[int]:
    try:
        return [int(seed) for seed in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def _ratios(text: str) -> list[float]:
    try:
        ratios = [float(ratio) for ratio in text.split(",")]
    except ValueError:
        ratios = []
    if not ratios or not all(0 < ratio <= 1 for ratio in ratios):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ratios in (0, 1]")
    return ratios


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python experiments/keep_ratio_sweep.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model-type", default="crossencoder", choices=("crossencoder", "biencoder"))
    parser.add_argument("--preset", default="quick", choices=("quick", "full"))
    parser.add_argument("--init", default="minilm", help="Starting weights: minilm, a model directory or name.")
    parser.add_argument("--seeds", type=_seeds, default=[0], help="Comma-separated training seeds.")
    parser.add_argument("--ratios", type=_ratios, default=[1.0, 0.75, 0.5], help="Comma-separated, in (0, 1].")
    parser.add_argument("--split", default="doctor", choices=("doctor", "grouped"))
    parser.add_argument("--folds", type=int_at_least(2), default=3)
    parser.add_argument("--fold-seed", type=int, default=0)
    parser.add_argument(
        "--dev-groups", type=positive_int, default=MIN_DEV_GROUPS, help="Fewest groups in each dev part."
    )
    parser.add_argument("--lr", type=float, help="Learning rate (override the preset).")
    parser.add_argument("--epochs", type=positive_int, help="Epochs (override the preset).")
    parser.add_argument(
        "--sibling-negatives",
        action="store_true",
        help="Add each training group's similar and dissimilar rewrite as one more negative pair.",
    )
    parser.add_argument("--prior-scale", type=float, help="Prior scale (override the preset; 0: no prior).")
    parser.add_argument("--prior-encoder", help="The bi-encoder the cross-encoder corrects (override the preset).")
    parser.add_argument(
        "--threshold-rule", default="auto", choices=THRESHOLD_RULES, help="As in medfaq eval duplicates."
    )
    parser.add_argument("--json", action="store_true", help="Print one JSON object (the tables go to stderr).")
    args = parser.parse_args(argv)
    try:
        summary = keep_ratio_sweep(
            mqp_pairs(),
            args.model_type,
            args.preset,
            args.init,
            args.seeds,
            args.ratios,
            args.split,
            args.folds,
            args.fold_seed,
            args.dev_groups,
            overrides={
                "lr": args.lr,
                "epochs": args.epochs,
                "sibling_negatives": args.sibling_negatives or None,
                "prior_scale": args.prior_scale,
                "prior_encoder": args.prior_encoder,
            },
            print_fn=partial(print, file=sys.stderr if args.json else sys.stdout),
            threshold_rule=args.threshold_rule,
        )
    except MedfaqError as error:
        parser.exit(2, f"error: {error}\n")
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
