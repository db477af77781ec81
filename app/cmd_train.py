"""`medfaq train summarizer|average|biencoder|crossencoder|student|calibrate`: the summarizer and the encoders."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from medfaq.app.config_options import takes_config_options
from medfaq.app.options import DEVICE, NO_OVERRIDES, takes_training_overrides
from medfaq.common.runtime import UNFINISHED_FILE, MedfaqError, check_out_dir, resolve_model
from medfaq.index.datasets import FAQ_SOURCES, OPTIONAL_FAQ_SOURCES
from medfaq.retriever.biencoder.student_config import StudentTrainConfig
from medfaq.summarizer.training.config import SummarizerTrainConfig

if TYPE_CHECKING:
    from medfaq.retriever.training.config import EncoderTrainConfig

DEFAULT_PRETRAIN = ["rqe:train", "healthcaremagic:train", "chq_summ:train"]
WRITER_BACKBONE = "gemma-3-270m"
WRITER_PAIRS = 960  # 120 steps of 8: about 16 minutes for Gemma 3 270M on 2 CPU cores
# how a question writer's run goes (not what it learns): what a resumed run may change
WRITER_RUNTIME = ("threads", "precision", "save_every_steps", "max_steps")
UNFINISHED_EXIT = 3  # a summarizer run stopped before its end (--max-steps): its checkpoint waits for --resume


def retrieval_negatives_index(index: Path | None) -> Path:
    """The index `--retrieval-negatives` searches (None: the set-up index); a path that is no index fails here."""
    from medfaq.index.storage import read_manifest
    from medfaq.retriever.trained_models import set_up_index

    index = Path(index).expanduser() if index is not None else set_up_index()
    read_manifest(index)
    return index


def mine_retrieval_negatives(pairs: list[tuple[str, str]], n_negatives: int, index: Path) -> list[dict]:
    """The retrieval's near misses for each training CHQ from `index` (`retrieval_near_misses`)."""
    from medfaq.retriever.training.pair_data import retrieval_near_misses

    rows = retrieval_near_misses(index, pairs, n_negatives)
    typer.echo(f"mined {sum(len(r['negatives']) for r in rows)} retrieval negatives from {index}", err=True)
    return rows


def _pairs(spec: str, data_root: Path | None) -> list[tuple[str, str]]:
    from medfaq.eval.summarization_data import load_pairs

    return [(pair.chq, pair.faq) for pair in load_pairs(spec, data_root)]


def resumed_config(out: Path, options: dict[str, Any]):
    """The config of the interrupted summarizer run in `out` (its ``last/`` checkpoint), with the options given now;
    a stop requested for the interrupted run (``max_steps``) does not carry over."""
    from medfaq.summarizer.training.trainer import LAST_DIR

    if not (out / LAST_DIR).is_dir():
        raise MedfaqError(f"nothing to resume in {out} (no {LAST_DIR}/ checkpoint)")
    saved = SummarizerTrainConfig.load(out / LAST_DIR)
    return SummarizerTrainConfig(**{**saved.__dict__, "max_steps": 0, **options})


def best_rouge(history: list[dict]) -> str:
    """The best validation ROUGE-L of a summarizer run's main stage, or n/a."""
    best = max((h["valid_rougeL"] for h in history if h.get("stage") == "main"), default=None)
    return "n/a" if best is None else f"{best:.2f}"


def stop_if_unfinished(out: Path, command: str) -> None:
    """Where the run in `out` stopped before its end (``--max-steps``), say so and how to resume it, in one line,
    and exit with `UNFINISHED_EXIT`: the directory holds a checkpoint, not a model."""
    if (out / UNFINISHED_FILE).is_file():
        typer.echo(
            f"error: training stopped before its end (--max-steps): {out} holds its checkpoint, not a model; "
            f"continue it with `medfaq train {command} --out {out} --resume`",
            err=True,
        )
        raise typer.Exit(UNFINISHED_EXIT)


@takes_config_options(SummarizerTrainConfig)
def train_summarizer(
    data: str = typer.Option("meqsum", "--data", help="Data set with train and valid splits (e.g. meqsum)."),
    variant: str = typer.Option("ecl", "--variant", help="ecl|mle|ecl-s|ecl-h|qfcl|learned|rank."),
    preset: str = typer.Option(
        "quick", "--preset", help="quick (MiniLM: ≤ 20 min on 2 CPU cores; Gemma: 2 epochs) | full (GPU)."
    ),
    seed: int = typer.Option(0, "--seed", help="Random seed."),
    out: Path = typer.Option(..., "--out", help="Output directory (the best model; last/ holds the checkpoint)."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run in --out from last/."),
    pretrain: bool = typer.Option(False, "--pretrain", help=f"Pre-train on {', '.join(DEFAULT_PRETRAIN)} first."),
    pretrain_data: list[str] | None = typer.Option(None, "--pretrain-data", help="Pre-training split (repeatable)."),
    data_root: Path | None = typer.Option(None, "--data-root", help="Read data laid out like ../shared/data."),
    overrides: Mapping[str, Any] = NO_OVERRIDES,
    retrieval_index: Path | None = typer.Option(
        None, "--retrieval-index", help="The index --retrieval-negatives searches (default: the set-up index)."
    ),
    device: str | None = DEVICE,
) -> None:
    """Train the CHQ→FAQ summarizer with one ECL variant; prints one JSON line per epoch.

    With ``--backbone gemma-3-270m`` the first run de-quantises the bundled Gemma 3 270M once into the models directory.
    """
    from medfaq.summarizer.training.config import preset_config
    from medfaq.summarizer.training.trainer import SummarizerTrainer, check_run_dir

    options = dict(overrides)
    if device is not None:
        options["device"] = device
    if pretrain or pretrain_data:
        options["pretrain"] = list(pretrain_data or DEFAULT_PRETRAIN)
    check_run_dir(out, resume)  # before any data or model is read
    if resume:
        config = resumed_config(out, options)
    else:
        config = preset_config(preset, variant, seed=seed, **options)
    train = _pairs(config.train_data or f"{data}:train", data_root)
    valid = _pairs(f"{data}:valid", data_root)
    extra = [pair for spec in config.pretrain for pair in _pairs(spec, data_root)]
    mining = config.n_retrieval_negatives and config.uses_hard and not resume  # a resumed run reads its saved file
    index = retrieval_negatives_index(retrieval_index) if mining else None  # before any model loads
    trainer = SummarizerTrainer(config, out, resume=resume)  # an --out in use fails before the mining
    mined = mine_retrieval_negatives(train, config.n_retrieval_negatives, index) if index else []
    history = trainer.train(train, valid, extra, retrieval_negatives=mined)
    stop_if_unfinished(out, "summarizer")
    typer.echo(
        f"trained {config.variant} ({config.preset}, seed {config.seed}); best valid ROUGE-L {best_rouge(history)}; "
        f"model in {out}"
    )


@takes_config_options(SummarizerTrainConfig, "runtime", only=WRITER_RUNTIME)
def train_question_writer(
    out: Path = typer.Option(..., "--out", help="Output directory (the best model; last/ holds the checkpoint)."),
    train_data: str | None = typer.Option(
        None, "--train-data", help="Summarization pairs turned round (default: meqsum, healthcaremagic, chq_summ, rqe)."
    ),
    backbone: str = typer.Option(
        WRITER_BACKBONE,
        "--backbone",
        help="gemma-3-270m, minilm (its encoder-decoder wrote text unrelated to the FAQ: docs/results.md), a "
        "directory, or a HF seq2seq or causal-LM id.",
    ),
    preset: str = typer.Option("quick", "--preset", help="quick | full (GPU)."),
    epochs: int = typer.Option(1, "--epochs", min=1, help="Epochs."),
    max_pairs: int | None = typer.Option(
        WRITER_PAIRS, "--max-pairs", min=2, help="Train on a seeded sample of N pairs (the quick run on a CPU)."
    ),
    seed: int = typer.Option(0, "--seed", help="Random seed."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run in --out from last/."),
    data_root: Path | None = typer.Option(None, "--data-root", help="Read data laid out like ../shared/data."),
    runtime: Mapping[str, Any] = NO_OVERRIDES,
) -> None:
    """Train the question writer: FAQ (question and head of answer) -> the consumer questions it answers, the
    summarization pairs turned round; `medfaq index adapt` samples questions for every FAQ of a bank with it."""
    import random

    from medfaq.summarizer.modeling import backbone_is_causal
    from medfaq.summarizer.question_writer import (
        WRITER_SETTINGS,
        WRITER_TRAIN,
        WRITER_VALID,
        reversed_pairs,
        save_vocabulary,
    )
    from medfaq.summarizer.training.config import preset_config
    from medfaq.summarizer.training.trainer import SummarizerTrainer, check_run_dir

    check_run_dir(out, resume)  # before any data or model is read
    options = dict(runtime)
    if resume:  # the recipe is the interrupted run's; only how it runs may change
        config = resumed_config(out, options)
    else:
        options |= {"backbone": backbone, "epochs": epochs}
        settings = {"patience": 1, "eval_max_length": 64, **WRITER_SETTINGS}
        config = preset_config(preset, seed=seed, train_data=train_data or WRITER_TRAIN, **{**settings, **options})
    train = reversed_pairs(_pairs(config.train_data, data_root))
    if max_pairs and len(train) > max_pairs:
        train = random.Random(config.seed).sample(train, max_pairs)
    valid = reversed_pairs(_pairs(WRITER_VALID, data_root))
    history = SummarizerTrainer(config, out, resume=resume).train(train, valid)
    stop_if_unfinished(out, "question-writer")
    if backbone_is_causal(config.backbone) and (out / "config.json").is_file():
        every = _pairs(config.train_data, data_root)  # every pair's words, not only the sample trained on
        kept = save_vocabulary(out, [text for pair in every for text in pair])
        typer.echo(f"the writer samples over {kept} tokens of its training texts (and those of the FAQs it reads)")
    typer.echo(
        f"trained the question writer ({config.preset}, seed {config.seed}, {len(train)} pairs); best valid ROUGE-L "
        f"{best_rouge(history)}; model in {out}"
    )


def average(
    runs: list[str] = typer.Argument(..., help="Trained summarizer directories: one recipe, different seeds."),
    out: Path = typer.Option(..., "--out", help="Output directory for the averaged summarizer."),
) -> None:
    """Average the weights of summarizers trained with different seeds (a model soup): one model, as fast as each."""
    from medfaq.summarizer.training.averaging import average_summarizers

    check_out_dir(out)
    typer.echo(f"averaged {len(runs)} summarizers into {average_summarizers(runs, out)}")


TASK_HELP = "mqp (question pairs) | qa (MedQuAD question-answer, intermediate) | faq (query -> FAQ reranker)"


def render_pair_counts(counts: dict[str, dict[str, int]]) -> str:
    """The training pairs per source as a table, with a total row."""
    rows = [
        *counts.items(),
        ("total", {k: sum(row[k] for row in counts.values()) for k in ("queries", "positives", "negatives")}),
    ]
    lines = [f"{'source':<16} {'queries':>8} {'positives':>10} {'negatives':>10}"]
    lines += [f"{name:<16} {row['queries']:>8} {row['positives']:>10} {row['negatives']:>10}" for name, row in rows]
    return "\n".join(lines)


def training_models(config: EncoderTrainConfig) -> list[str]:
    """The models a run of `config` loads: its starting weights, the bi-encoder that mines its negatives, and the
    one a correction learns (`prior_scale`)."""
    return [config.init, config.negatives_encoder, *([config.prior_model] if config.prior_scale else [])]


def resolve_training_models(config: EncoderTrainConfig) -> None:
    """Resolve every model (and the lexicon, and the index feedback is about) `config` trains from or with, so a
    missing one, or one of another kind, fails with its one-line error first."""
    from medfaq.common.model_kinds import CROSSENCODER, ENCODER_KINDS, check_model_kind
    from medfaq.index.concepts import concept_lexicon
    from medfaq.index.storage import read_manifest

    init, *biencoders = training_models(config)
    starts = (CROSSENCODER, *ENCODER_KINDS) if config.model_type == CROSSENCODER else ENCODER_KINDS
    check_model_kind(resolve_model(init), starts, init)
    for name in biencoders:
        check_model_kind(resolve_model(name), ENCODER_KINDS, name)
    concept_lexicon(config.faq_synonyms)
    if config.feedback_index:
        read_manifest(Path(config.feedback_index).expanduser())


def train_command(model_type: str) -> Callable[..., None]:
    @takes_training_overrides()
    def train(
        task: str = typer.Option("mqp", "--task", help=TASK_HELP),
        out: Path = typer.Option(..., "--out", help="Directory to save the model and its train_config.json."),
        init: str = typer.Option("minilm", "--init", help="Starting weights: minilm, a model directory or name."),
        preset: str = typer.Option("quick", "--preset", help="quick | full"),
        seed: int = typer.Option(0, "--seed"),
        overrides: Mapping[str, Any] = NO_OVERRIDES,
        max_pairs: int | None = typer.Option(None, "--max-pairs", min=1, help="Train on at most this many pairs."),
        sources: str | None = typer.Option(
            None,
            "--sources",
            help=f"Task faq: the training sources, comma-separated (default: {','.join(FAQ_SOURCES)}; "
            f"also: {','.join(OPTIONAL_FAQ_SOURCES)}).",
        ),
        per_source: int | None = typer.Option(
            None, "--per-source", min=1, help="Task faq: at most this many queries per source (override the preset)."
        ),
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
        feedback: bool = typer.Option(
            False,
            "--feedback",
            help='Task faq: also learn from the experts\' links (`medfaq queue`) and the "Was this helpful?" answers '
            "about an index (a fifth of the linked groups is held back for evaluation).",
        ),
        feedback_index: Path | None = typer.Option(
            None, "--feedback-index", help="The index that feedback is about (default: the set-up index)."
        ),
        device: str | None = DEVICE,
        force: bool = typer.Option(False, "--force", help="Overwrite a non-empty --out directory."),
    ) -> None:
        from medfaq.retriever.trained_models import set_up_index
        from medfaq.retriever.training.config import make_config
        from medfaq.retriever.training.pair_data import pair_counts, task_pairs
        from medfaq.retriever.training.pair_models import save_trained, train_pair_model

        config = make_config(
            model_type,
            task,
            preset,
            init=init,
            seed=seed,
            max_pairs=max_pairs,
            faq_sources=tuple(filter(None, map(str.strip, sources.split(",")))) if sources is not None else None,
            faq_per_source=per_source,
            faq_negatives=negatives,
            negatives_encoder=negatives_encoder,
            faq_synonyms=synonyms,
            feedback_index=str(feedback_index or set_up_index()) if feedback or feedback_index else None,
            **overrides,
        )
        check_out_dir(out, force)
        resolve_training_models(config)  # a bad model or --synonyms fails before the data is built
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


def _calibrate_after_training(model: Path, data_from: Path | None = None) -> None:
    """Store a freshly trained retrieval model's abstention threshold; without the development data, say how to
    store it later instead of failing the training."""
    try:
        _report_threshold(model, data_from)
    except MedfaqError as error:
        typer.echo(
            f"warning: no abstention threshold stored ({error}); later: `medfaq train calibrate {model}`",
            err=True,
        )


def _report_threshold(model: Path | str, data_from: Path | None = None, seed: int = 0) -> None:
    from medfaq.retriever.decisions.abstention import THRESHOLD_FILE, calibrate_model

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
    from medfaq.index.storage import read_manifest

    manifests = {directory: read_manifest(directory) for directory in index}  # a wrong directory fails first
    _report_threshold(model, data_from, seed)
    for directory, manifest in manifests.items():
        if not inherit_threshold(directory, manifest.encoder, Path(resolve_model(model))):
            why = f"encoded by {manifest.encoder}, or a threshold calibrated on it already"
            typer.echo(f"warning: {directory} left as it was ({why})", err=True)


@takes_config_options(StudentTrainConfig, "settings", with_defaults=True)
def train_student(
    out: Path = typer.Option(
        ...,
        "--out",
        help="Directory to save the student and its train_config.json (the teacher's vectors: OUT.teacher)",
    ),
    settings: Mapping[str, Any] = NO_OVERRIDES,
    data_root: Path | None = typer.Option(None, "--data-root", help="Read data laid out like ../shared/data."),
    device: str | None = DEVICE,
    force: bool = typer.Option(False, "--force", help="Overwrite a non-empty --out directory."),
) -> None:
    """Distil a teacher encoder into a fast student: MSE between their vectors over every training question text.

    The teacher's vectors are encoded once into OUT.teacher beside OUT; a run stopped while encoding them, repeated,
    encodes only what is missing."""
    from medfaq.index.model_files import check_model_directory, declared_dimension
    from medfaq.retriever.biencoder.distill import check_alignable
    from medfaq.retriever.biencoder.distill import train_student as fit_student
    from medfaq.retriever.biencoder.distill_data import (
        distillation_texts,
        source_counts,
        split_texts,
        teacher_cache_dir,
        teacher_encoder,
        teacher_vectors,
    )
    from medfaq.retriever.training.pair_models import save_trained

    config = StudentTrainConfig(**settings)
    check_out_dir(out, force)
    for name in (config.init, config.teacher):  # a wrong model, or one of another kind, fails before the data is read
        check_model_directory(resolve_model(name), name)
    train, dev = split_texts(distillation_texts(data_root), config.max_texts, config.dev_fraction, config.seed)
    if config.teacher_space == "aligned":  # before the teacher encodes them
        check_alignable(
            *(declared_dimension(resolve_model(name)) for name in (config.init, config.teacher)), len(train)
        )
    config.text_counts = source_counts(train + dev)
    config.n_train_pairs, config.n_dev_texts = len(train), len(dev)
    counts = ", ".join(f"{source} {count}" for source, count in config.text_counts.items())
    typer.echo(f"student on {len(train)} texts, {len(dev)} held out ({counts})", err=True)
    encoder = teacher_encoder(config.teacher, config.teacher_backend, device)
    config.teacher_backend, config.teacher_fingerprint = encoder.backend, encoder.fingerprint
    vectors = teacher_vectors(encoder, dev + train, teacher_cache_dir(out))
    del encoder
    model = fit_student(
        [item.text for item in train],
        vectors[len(dev) :],
        config,
        [item.text for item in dev],
        vectors[: len(dev)],
        device,
    )
    save_trained(model, config, out)
    typer.echo(f"saved the student of {config.teacher} to {out}")
    if dev:
        before, after = config.dev_before, config.dev_after
        typer.echo(
            f"held-out texts: MSE to the teacher {before['mse']:.3g} -> {after['mse']:.3g}, "
            f"mean cosine {before['cosine']:.4f} -> {after['cosine']:.4f}"
        )
    _calibrate_after_training(out, data_root)
