"""The encoder training config (``train_config.json`` beside every trained model) and its presets.

A trained model is a directory with the weights (safetensors), the tokenizer and ``train_config.json`` (an
:class:`EncoderTrainConfig`), so a run can be repeated from its config alone.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from medfaq.common.model_kinds import KIND_KEY, STUDENT, TRAIN_CONFIG
from medfaq.common.runtime import PRECISIONS, MedfaqError
from medfaq.index.datasets import FAQ_SOURCES, OPTIONAL_FAQ_SOURCES

CONFIG_FILE = TRAIN_CONFIG
MODEL_TYPES = ("biencoder", "crossencoder")
TASKS = ("mqp", "qa", "faq")
DISTILL_TASK = "distill"
"""The task of a student fitted to a teacher's vectors (`medfaq train student`, retriever/biencoder/distill.py)."""
PRESETS = ("quick", "full")
LOSSES = ("contrastive", "mnrl", "bce", "listwise", "mse")
CROSSENCODER_LOSSES = ("bce", "listwise")
HEADS = ("cosine", "mean", "cls", "pooler")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise MedfaqError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")


@dataclass
class EncoderTrainConfig:
    """One encoder training run: model type, task, starting weights, optimisation and data settings."""

    model_type: str = "crossencoder"
    task: str = "mqp"
    init: str = "minilm"
    preset: str = "quick"
    seed: int = 0
    epochs: int = 2
    batch_size: int = 16
    lr: float = 3e-5
    max_length: int | None = 64  # None: measured on the training pairs (cross-encoder)
    loss: str = "bce"  # crossencoder: bce | listwise (task faq); biencoder: contrastive | mnrl
    margin: float = 0.3  # ContrastiveLoss margin (cosine distance)
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_pairs: int | None = None  # cap on training pairs (after shuffling with `seed`)
    qa_include_rqe: bool = False  # task qa: add the RQE train entailment pairs
    sibling_negatives: bool = False  # task mqp: each training group's similar and dissimilar rewrite, as a negative
    faq_sources: tuple[str, ...] = FAQ_SOURCES  # task faq
    faq_negatives: int = 3  # task faq: hard negatives mined per query
    faq_per_source: int | None = None  # task faq: at most this many queries from each source (seeded sample)
    negatives_encoder: str = "minilm"  # bi-encoder that mines hard negatives
    faq_synonyms: str = "none"  # task faq: FAQ sides read with their concepts' other names (as index --synonyms)
    feedback_index: str | None = None  # task faq: also the experts' links and search feedback about this index
    head: str = "cosine"  # cross-encoder head: cosine | mean | cls | pooler (see retriever.reranker.model)
    symmetric: bool = False  # train on both pair orders and score both (tasks where order carries no meaning)
    dev_fraction: float = 0.0  # group-disjoint dev part carved from the training pairs for best-epoch selection
    keep_ratio: float = 1.0  # final weights = start + keep_ratio x (fine-tuned - start); 1: the fine-tuned ones
    prior_scale: float = 0.0  # cross-encoder: logits += prior_scale x cosine of the prior encoder (learn a correction)
    prior_encoder: str | None = None  # the bi-encoder that prior is (None: negatives_encoder, the first stage)
    length_buckets: bool = False  # bi-encoder: queries of similar length share a batch (less padding, faster steps)
    precision: str = "auto"  # training matrix products: fp32 | bf16 | auto (bf16 where measured faster; the one used)
    n_train_pairs: int = 0  # filled in by training
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_choice("model type", self.model_type, MODEL_TYPES)
        _check_choice("task", self.task, (*TASKS, DISTILL_TASK))
        _check_choice("preset", self.preset, PRESETS)
        _check_choice("loss", self.loss, LOSSES)
        _check_choice("head", self.head, HEADS)
        _check_choice("precision", self.precision, PRECISIONS)
        if (self.loss in CROSSENCODER_LOSSES) != (self.model_type == "crossencoder"):
            wanted = "bce or listwise" if self.model_type == "crossencoder" else "contrastive or mnrl"
            raise MedfaqError(f"loss {self.loss!r} does not fit a {self.model_type}; use {wanted}")
        if (self.loss == "mse") != (self.task == DISTILL_TASK):
            raise MedfaqError("the mse loss fits a student to a teacher's vectors, alone: `medfaq train student`")
        if self.loss == "listwise" and self.task != "faq":
            raise MedfaqError("the listwise loss ranks each query's mined candidates: it needs --task faq")
        if self.sibling_negatives and self.task != "mqp":
            raise MedfaqError("--sibling-negatives pairs the rewrites of an MQP question: it needs --task mqp")
        if self.faq_synonyms != "none" and self.task != "faq":
            raise MedfaqError("--synonyms reads FAQs as a synonym index shows them to a reranker: it needs --task faq")
        if self.feedback_index and self.task != "faq":
            raise MedfaqError("--feedback learns which FAQ answers a question: it needs --task faq")
        if self.length_buckets and self.model_type != "biencoder":
            raise MedfaqError("--length-buckets shapes a bi-encoder's batches; a cross-encoder's are always bucketed")
        if self.prior_scale < 0:
            raise MedfaqError("--prior-scale must be 0 (off) or positive")
        if self.prior_scale and self.model_type != "crossencoder":
            raise MedfaqError("--prior-scale trains a cross-encoder to correct a bi-encoder; a bi-encoder takes none")
        if self.epochs < 1 or self.batch_size < 1 or (self.max_length or 8) < 8 or self.lr <= 0:
            raise MedfaqError("epochs and batch size must be >= 1, max length >= 8 and the learning rate > 0")
        if not 0 <= self.dev_fraction < 1:
            raise MedfaqError("the dev fraction must be in [0, 1)")
        if not 0 < self.keep_ratio <= 1:
            raise MedfaqError("the keep ratio must be in (0, 1]")
        self.faq_sources = tuple(self.faq_sources)

    @property
    def prior_model(self) -> str:
        """The bi-encoder whose cosine a cross-encoder with `prior_scale` > 0 is trained to correct."""
        return self.prior_encoder or self.negatives_encoder

    @property
    def kind(self) -> str:
        """The kind of model this run trains, as its saved config declares it (common/model_kinds.py)."""
        return STUDENT if self.task == DISTILL_TASK else self.model_type

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / CONFIG_FILE
        path.write_text(json.dumps({KIND_KEY: self.kind, **asdict(self)}, indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> EncoderTrainConfig:
        path = Path(directory) / CONFIG_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            known = {f.name for f in fields(cls)}
            return cls(**{key: value for key, value in data.items() if key in known})
        except FileNotFoundError:
            raise MedfaqError(f"{directory} has no {CONFIG_FILE}: not a model trained by `medfaq train`") from None
        except (json.JSONDecodeError, TypeError) as error:
            raise MedfaqError(f"{path} is not a valid training config: {error}") from None


# Settings per (preset, task); `quick` keeps one run (or one cross-validation fold) to minutes on 2 CPU cores.
PRESET_SETTINGS: dict[tuple[str, str], dict[str, Any]] = {
    ("quick", "mqp"): {"epochs": 1, "max_length": 64, "lr": 5e-5},
    ("quick", "qa"): {"epochs": 1, "max_length": 64, "lr": 3e-5, "max_pairs": 2000},
    ("quick", "faq"): {
        "epochs": 1,
        "max_length": 64,
        "lr": 5e-5,
        "max_pairs": 4000,
        "faq_negatives": 1,
        "faq_per_source": 1500,
    },
    ("full", "mqp"): {"epochs": 4, "max_length": 96, "lr": 2e-5},
    ("full", "qa"): {"epochs": 1, "max_length": 192, "lr": 2e-5, "qa_include_rqe": True},
    ("full", "faq"): {"epochs": 2, "max_length": 128, "lr": 2e-5, "faq_negatives": 4},
}
BIENCODER_SETTINGS = {"loss": "contrastive", "lr_scale": 2.0, "batch_size": 32}
# The retrieval bi-encoder (task faq): MultipleNegativesRankingLoss over every positive of the capped sources, with
# one mined hard negative each; CHQs cut at 128 tokens in training; half of the change to MiniLM's weights kept (it
# matched or beat the full fine-tune on 4 of 6 benchmarks and never fell below MiniLM's Recall@1; docs/results.md).
BIENCODER_PRESETS: dict[tuple[str, str], dict[str, Any]] = {
    ("quick", "faq"): {"loss": "mnrl", "lr": 2e-5, "max_length": 128, "max_pairs": None, "keep_ratio": 0.5},
    ("full", "faq"): {"loss": "mnrl", "lr": 2e-5, "max_length": 256, "epochs": 2, "faq_negatives": 1},
}
# Cross-encoder settings over the preset's (chosen on MQP doctor-disjoint dev parts, see docs/results.md): cosine
# head, max length measured on the training pairs, label-balanced batches, best epoch by dev ROC AUC. The quick MQP
# preset keeps 3/4 of the fine-tuning change (WiSE-FT: 84.1 ± 0.3 % doctor-disjoint accuracy over training seeds 0-2
# on seed 0's folds against 82.4 ± 0.8 % for the fine-tuned weights alone) and learns a correction of untrained
# all-mpnet-base-v2's cosine (--prior-scale 10; the preset's own command over seeds 0-2, see docs/results.md).
CROSSENCODER_SETTINGS: dict[str, Any] = {"max_length": None, "dev_fraction": 0.1, "head": "cosine"}
CROSSENCODER_PRESETS: dict[tuple[str, str], dict[str, Any]] = {
    ("quick", "mqp"): {
        "epochs": 1,
        "lr": 5e-5,
        "symmetric": True,
        "keep_ratio": 0.75,
        "prior_scale": 10.0,
        "prior_encoder": "mpnet",
    },
    ("full", "mqp"): {"epochs": 3, "lr": 3e-5, "symmetric": True},
}


def make_config(model_type: str, task: str, preset: str, **overrides: Any) -> EncoderTrainConfig:
    """The preset's settings for `model_type` and `task`, then `overrides` (None values are ignored)."""
    if task == DISTILL_TASK:
        raise MedfaqError("a student is distilled from a teacher by `medfaq train student`")
    _check_choice("model type", model_type, MODEL_TYPES)
    _check_choice("task", task, TASKS)
    _check_choice("preset", preset, PRESETS)
    settings = dict(PRESET_SETTINGS[(preset, task)])
    if model_type == "biencoder":
        settings["lr"] = settings["lr"] * BIENCODER_SETTINGS["lr_scale"]
        settings["loss"] = BIENCODER_SETTINGS["loss"]
        settings["batch_size"] = BIENCODER_SETTINGS["batch_size"]
        settings.update(BIENCODER_PRESETS.get((preset, task), {}))
    else:
        settings.update(CROSSENCODER_SETTINGS)
        settings.update(CROSSENCODER_PRESETS.get((preset, task), {}))
    settings.update({key: value for key, value in overrides.items() if value is not None})
    if settings.get("faq_sources") is not None:
        _check_sources(task, tuple(settings["faq_sources"]))
    if settings.get("faq_per_source") is not None and settings["faq_per_source"] < 1:
        raise MedfaqError("--per-source must be at least 1")
    return EncoderTrainConfig(model_type=model_type, task=task, preset=preset, **settings)


def _check_sources(task: str, sources: tuple[str, ...]) -> None:
    """Chosen query -> FAQ training sources (checked for a new run only: a saved config keeps the sources it was
    trained on, even ones since renamed)."""
    if task != "faq":
        raise MedfaqError("--sources picks the query -> FAQ training sources: it needs --task faq")
    known = (*FAQ_SOURCES, *OPTIONAL_FAQ_SOURCES)
    unknown = [source for source in sources if source not in known]
    if unknown or not sources:
        named = f"unknown training source {', '.join(unknown)}" if unknown else "no training source"
        raise MedfaqError(f"{named}; choose from {', '.join(known)}")
