"""`medfaq train biencoder|crossencoder` and `medfaq eval duplicates`: the duplicate-question detector."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from medfaq.app.options import finite, positive
from medfaq.common.runtime import PRECISION_HELP, MedfaqError, resolve_model

if TYPE_CHECKING:
    from medfaq.retriever.encoder_training import EncoderTrainConfig

TASK_HELP = "mqp (question pairs) | qa (MedQuAD question-answer, intermediate) | faq (query -> FAQ reranker)"


EPOCHS = typer.Option(None, "--epochs", min=1, help="Override the preset.")
BATCH_SIZE = typer.Option(None, "--batch-size", min=1, help="Override the preset.")
LR = typer.Option(None, "--lr", callback=positive, help="Learning rate (override the preset).")
MAX_LENGTH = typer.Option(None, "--max-length", min=1, help="Max tokens (override the preset).")
LOSS = typer.Option(
    None,
    "--loss",
    help="Bi-encoder: contrastive | mnrl; cross-encoder: bce | listwise (task faq: softmax over each query's "
    "positive and its mined negatives).",
)
DEVICE = typer.Option(None, "--device", help="cpu | cuda (default: cuda when available).")
HEAD = typer.Option(None, "--head", help="Cross-encoder head: cosine (default) | mean | cls | pooler.")
PRECISION = typer.Option(None, "--precision", help=PRECISION_HELP)
KEEP_RATIO = typer.Option(
    None, "--keep-ratio", min=0.01, max=1.0, help="Keep this share of the fine-tuning change (WiSE-FT; override)."
)
PRIOR_SCALE = typer.Option(
    None,
    "--prior-scale",
    min=0.0,
    help="Cross-encoder: add this x the prior encoder's cosine to every logit, so the model learns a correction of "
    "that bi-encoder (saved with it; 0: off).",
)
PRIOR_ENCODER = typer.Option(
    None,
    "--prior-encoder",
    help="With --prior-scale: the bi-encoder corrected, e.g. mpnet (default: --negatives-encoder, the first stage).",
)
SIBLING_NEGATIVES = typer.Option(
    None,
    "--sibling-negatives/--no-sibling-negatives",
    help="Task mqp: each training group's similar and dissimilar rewrite as one more negative (override).",
)


def _tuning(
    epochs: int | None,
    batch_size: int | None,
    lr: float | None,
    max_length: int | None,
    loss: str | None,
    head: str | None = None,
    keep_ratio: float | None = None,
    precision: str | None = None,
    sibling_negatives: bool | None = None,
):
    """The preset overrides both commands share (None = keep the preset)."""
    return {
        "epochs": epochs,
        "batch_size": batch_size,
        "lr": lr,
        "max_length": max_length,
        "loss": loss,
        "head": head,
        "keep_ratio": keep_ratio,
        "precision": precision,
        "sibling_negatives": sibling_negatives,
    }


def render_pair_counts(counts: dict[str, dict[str, int]]) -> str:
    """The training pairs per source as a table, with a total row."""
    rows = [
        *counts.items(),
        ("total", {k: sum(row[k] for row in counts.values()) for k in ("queries", "positives", "negatives")}),
    ]
    lines = [f"{'source':<16} {'queries':>8} {'positives':>10} {'negatives':>10}"]
    lines += [f"{name:<16} {row['queries']:>8} {row['positives']:>10} {row['negatives']:>10}" for name, row in rows]
    return "\n".join(lines)


def _resolve_models(config: EncoderTrainConfig) -> None:
    """Resolve every model (and the lexicon) `config` trains from or with, so a missing one fails with its one-line
    error first."""
    from medfaq.index.concepts import concept_lexicon

    for name in (config.init, config.negatives_encoder, *([config.prior_model] if config.prior_scale else [])):
        resolve_model(name)
    concept_lexicon(config.faq_synonyms)


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise MedfaqError(f"{out} exists and is not empty; pass --force to overwrite")


def _train_command(model_type: str) -> Callable[..., None]:
    def train(
        task: str = typer.Option("mqp", "--task", help=TASK_HELP),
        out: Path = typer.Option(..., "--out", help="Directory to save the model and its train_config.json."),
        init: str = typer.Option("minilm", "--init", help="Starting weights: minilm, a model directory or name."),
        preset: str = typer.Option("quick", "--preset", help="quick | full"),
        seed: int = typer.Option(0, "--seed"),
        epochs: int | None = EPOCHS,
        batch_size: int | None = BATCH_SIZE,
        lr: float | None = LR,
        max_length: int | None = MAX_LENGTH,
        loss: str | None = LOSS,
        head: str | None = HEAD,
        max_pairs: int | None = typer.Option(None, "--max-pairs", min=1, help="Train on at most this many pairs."),
        negatives: int | None = typer.Option(
            None, "--negatives", min=1, help="Task faq: hard negatives mined per query (override the preset)."
        ),
        negatives_encoder: str | None = typer.Option(
            None,
            "--negatives-encoder",
            help="Task faq: the bi-encoder that mines them (default minilm; for a reranker, the index's encoder).",
        ),
        synonyms: str | None = typer.Option(
            None,
            "--synonyms",
            help="Task faq: read each FAQ with its concepts' other names, as a reranker over an index built with "
            "the same --synonyms reads it: none (default), medquad or a JSONL file of focus/synonyms rows.",
        ),
        prior_scale: float | None = PRIOR_SCALE,
        prior_encoder: str | None = PRIOR_ENCODER,
        keep_ratio: float | None = KEEP_RATIO,
        precision: str | None = PRECISION,
        sibling_negatives: bool | None = SIBLING_NEGATIVES,
        device: str | None = DEVICE,
        force: bool = typer.Option(False, "--force", help="Overwrite a non-empty --out directory."),
    ) -> None:
        from medfaq.retriever.encoder_training import make_config, save_trained
        from medfaq.retriever.pair_data import pair_counts, task_pairs
        from medfaq.retriever.pair_models import train_pair_model

        tuning = _tuning(epochs, batch_size, lr, max_length, loss, head, keep_ratio, precision, sibling_negatives)
        config = make_config(
            model_type,
            task,
            preset,
            init=init,
            seed=seed,
            max_pairs=max_pairs,
            faq_negatives=negatives,
            negatives_encoder=negatives_encoder,
            faq_synonyms=synonyms,
            prior_scale=prior_scale,
            prior_encoder=prior_encoder,
            **tuning,
        )
        _check_out(out, force)
        _resolve_models(config)  # a bad model or --synonyms fails before the data is built
        pairs = task_pairs(config)
        config.n_train_pairs = len(pairs)
        typer.echo(f"{model_type} on {task}: {len(pairs)} training pairs", err=True)
        if task == "faq":
            config.extra["pair_counts"] = pair_counts(pairs)
            typer.echo(render_pair_counts(config.extra["pair_counts"]), err=True)
        save_trained(train_pair_model(pairs, config, device), config, out)
        typer.echo(f"saved {model_type} to {out}")
        if task == "faq":
            _calibrate_after_training(out)

    train.__doc__ = f"Train the {model_type} on all training data of a task (mqp, qa or faq)."
    return train


def eval_duplicates(
    model_type: str | None = typer.Option(None, "--model-type", help="Cross-validate: biencoder | crossencoder."),
    init: str = typer.Option("minilm", "--init", help="Cross-validation: starting weights of every fold's model."),
    split: str = typer.Option("doctor", "--split", help="Cross-validation folds: doctor | grouped."),
    preset: str = typer.Option("quick", "--preset", help="quick | full"),
    folds: int | None = typer.Option(None, "--folds", min=2, help="Number of folds (default: 3 quick, 5 full)."),
    seed: int = typer.Option(0, "--seed"),
    dev_groups: int | None = typer.Option(
        None, "--dev-groups", min=1, help="Cross-validation: fewest doctors/groups per fold's dev part (default: 1)."
    ),
    model: str | None = typer.Option(None, "--model", help="Score a trained model on --pairs instead."),
    pairs: Path | None = typer.Option(None, "--pairs", help="Labelled pairs JSONL (text_a, text_b, label)."),
    threshold: float | None = typer.Option(
        None,
        "--threshold",
        callback=finite,
        help="With --model: decision threshold (default: the one saved with a cross-validation fold model; else a "
        "cross-encoder's own decision boundary: 0.5, or with a prior its median training cosine).",
    ),
    threshold_rule: str = typer.Option(
        "auto",
        "--threshold-rule",
        help="Cross-validation: auto (a cross-encoder's own decision boundary: 0.5, or with a prior its median "
        "training cosine, as a trained model applies it; a bi-encoder's thresholds tuned on the fold's dev part) | "
        "dev (tuned on dev) | boundary.",
    ),
    quantize: bool = typer.Option(False, "--quantize", help="Score with int8 dynamic quantisation (CPU)."),
    save_models: Path | None = typer.Option(
        None, "--save-models", help="Cross-validation: save each fold's model, thresholds and test pairs here."
    ),
    scores_out: Path | None = typer.Option(
        None, "--scores-out", help="Cross-validation: write every dev and test pair's score here (JSONL)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (fractions) instead of tables."),
    epochs: int | None = EPOCHS,
    batch_size: int | None = BATCH_SIZE,
    lr: float | None = LR,
    max_length: int | None = MAX_LENGTH,
    loss: str | None = LOSS,
    head: str | None = HEAD,
    keep_ratio: float | None = KEEP_RATIO,
    precision: str | None = PRECISION,
    sibling_negatives: bool | None = SIBLING_NEGATIVES,
    prior_scale: float | None = PRIOR_SCALE,
    prior_encoder: str | None = PRIOR_ENCODER,
    max_pairs: int | None = typer.Option(
        None, "--max-pairs", min=1, help="Train each fold on at most this many pairs."
    ),
    device: str | None = DEVICE,
) -> None:
    """Cross-validate a duplicate detector on MQP (one model per fold), or score a trained model on a labelled pairs
    file."""
    from medfaq.common.runtime import quantize_linear
    from medfaq.eval.duplicate_detection import (
        CV_FOLDS,
        MIN_DEV_GROUPS,
        DuplicateEvaluator,
        PairsEvaluator,
        check_threshold_rule,
        save_fold,
    )
    from medfaq.retriever.encoder_training import make_config, subsample
    from medfaq.retriever.pair_data import mqp_pairs, read_pairs_file
    from medfaq.retriever.pair_models import as_scorer, load_pair_scorer, saved_threshold, train_pair_model
    from medfaq.retriever.runs import check_output

    def echo(text: str) -> None:
        typer.echo(text, err=as_json)

    if model is not None or pairs is not None:
        if model is None or pairs is None or model_type is not None:
            raise MedfaqError("score a trained model with --model DIR --pairs FILE (without --model-type)")
        labelled = read_pairs_file(pairs)
        scorer = load_pair_scorer(model, device=device, quantize=quantize)
        chosen = threshold if threshold is not None else saved_threshold(model)
        result = PairsEvaluator(labelled, chosen, print_fn=echo)(scorer)
    else:
        if model_type is None:
            raise MedfaqError("give --model-type biencoder|crossencoder (cross-validation) or --model DIR --pairs FILE")
        check_threshold_rule(threshold_rule, has_boundary=model_type != "biencoder")
        tuning = _tuning(epochs, batch_size, lr, max_length, loss, head, keep_ratio, precision, sibling_negatives)
        config = make_config(
            model_type,
            "mqp",
            preset,
            init=init,
            seed=seed,
            prior_scale=prior_scale,
            prior_encoder=prior_encoder,
            **tuning,
        )
        _resolve_models(config)
        if save_models is not None:
            if quantize:
                raise MedfaqError("--save-models keeps the full-precision models; drop --quantize")
            _check_out(save_models, force=False)
        n_folds, min_dev_groups = folds or CV_FOLDS[preset], dev_groups or MIN_DEV_GROUPS
        if scores_out is not None:
            check_output(scores_out)
        evaluator = DuplicateEvaluator(
            mqp_pairs(),
            split,
            n_folds,
            seed,
            min_dev_groups=min_dev_groups,
            print_fn=echo,
            scores_path=scores_out,
            threshold_rule=threshold_rule,
        )

        fold_configs = []

        def fit(train, dev, fold):
            train = subsample(train, max_pairs, seed)
            fold_configs.append(replace(config, n_train_pairs=len(train)))
            trained = train_pair_model(train, fold_configs[-1], device, dev)
            if quantize:
                quantize_linear(trained.cpu())
            return as_scorer(trained, fold_configs[-1])

        def after_fold(fold, scorer, metrics, test_pairs):
            metrics.update(fold_configs[fold].extra.get("history", {}))
            if save_models is not None:
                save_fold(save_models / f"fold-{fold + 1}", scorer.model, fold_configs[fold], metrics, test_pairs)

        result = evaluator(fit, after_fold=after_fold)
        result.update(model_type=model_type, init=init, preset=preset, quantized=quantize)
    if as_json:
        typer.echo(json.dumps(result))


def _calibrate_after_training(model: Path) -> None:
    """Store a freshly trained retrieval model's abstention threshold; without the development data, say how to
    store it later instead of failing the training."""
    try:
        _report_threshold(model)
    except MedfaqError as error:
        typer.echo(
            f"warning: no abstention threshold stored ({error}); later: `medfaq train calibrate {model}`",
            err=True,
        )


def _report_threshold(model: Path | str, data_from: Path | None = None, seed: int = 0) -> None:
    from medfaq.retriever.abstention import THRESHOLD_FILE, calibrate_model

    stored = calibrate_model(model, data_from, seed)
    development = stored.development
    typer.echo(
        f"abstention threshold {stored.value:.4f} ({stored.key}) saved to {Path(resolve_model(str(model)))}/"
        f"{THRESHOLD_FILE}: on {stored.counts['in_scope']} development questions it answers "
        f"{development['answered']:.1f} % of them and abstains on {development['ood_abstained']:.1f} % once their "
        f"answers are removed (AUROC {development['auroc']:.1f})"
    )


def calibrate(
    model: str = typer.Argument(..., help="A trained retrieval bi-encoder or reranker (directory or model name)."),
    data_from: Path | None = typer.Option(
        None, "--from", help="Read the datasets from DIR (the shared/data layout) instead of `medfaq data fetch`."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the development questions' sample."),
    index: list[Path] = typer.Option(
        [],
        "--index",
        help="Also give this index, built with MODEL (or with the bi-encoder the reranker MODEL corrects) before it "
        "was calibrated, the threshold it would have inherited (repeatable).",
    ),
) -> None:
    """Calibrate a retrieval model's abstention threshold on its development split and store it with the model
    (threshold.json; training does this itself): indexes built with it then abstain out of the box."""
    from medfaq.app.cmd_index import inherit_threshold
    from medfaq.index.faq_index import read_manifest

    manifests = {directory: read_manifest(directory) for directory in index}  # a wrong directory fails first
    _report_threshold(model, data_from, seed)
    for directory, manifest in manifests.items():
        if not inherit_threshold(directory, manifest.encoder, Path(resolve_model(model))):
            why = f"encoded by {manifest.encoder}, or a threshold calibrated on it already"
            typer.echo(f"warning: {directory} left as it was ({why})", err=True)


def register(app: typer.Typer, *, data_app: typer.Typer, train_app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add this module's commands to the `medfaq` command groups."""
    for model_type in ("biencoder", "crossencoder"):
        train_app.command(model_type)(_train_command(model_type))
    train_app.command("calibrate")(calibrate)
    eval_app.command("duplicates")(eval_duplicates)
