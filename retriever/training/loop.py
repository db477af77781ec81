"""What bi-encoder and cross-encoder training share: the config, its presets, the training loop, quantisation.

A trained model is a directory with the weights (safetensors), the tokenizer and ``train_config.json`` (an
:class:`EncoderTrainConfig`), so a run can be repeated from its config alone.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from tqdm.auto import tqdm

from medfaq.common.runtime import PRECISIONS, MedfaqError, autocast, resolve_precision, seed_everything

logger = logging.getLogger("medfaq.training")

CONFIG_FILE = "train_config.json"
MODEL_TYPES = ("biencoder", "crossencoder")
TASKS = ("mqp", "qa", "faq")
PRESETS = ("quick", "full")
LOSSES = ("contrastive", "mnrl", "bce", "listwise")
CROSSENCODER_LOSSES = ("bce", "listwise")
HEADS = ("cosine", "mean", "cls", "pooler")
FAQ_SOURCES = ("meqsum", "healthcaremagic", "chq_summ", "rqe", "mqp", "quebec")
"""Training sources of the query -> FAQ task (see ``retriever.training.pair_data``), all on by default."""

T = TypeVar("T")


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
    head: str = "cosine"  # cross-encoder head: cosine | mean | cls | pooler (see retriever.crossencoder)
    symmetric: bool = False  # train on both pair orders and score both (tasks where order carries no meaning)
    dev_fraction: float = 0.0  # group-disjoint dev part carved from the training pairs for best-epoch selection
    keep_ratio: float = 1.0  # final weights = start + keep_ratio x (fine-tuned - start); 1: the fine-tuned ones
    prior_scale: float = 0.0  # cross-encoder: logits += prior_scale x cosine of the prior encoder (learn a correction)
    prior_encoder: str | None = None  # the bi-encoder that prior is (None: negatives_encoder, the first stage)
    precision: str = "auto"  # training matrix products: fp32 | bf16 | auto (bf16 where measured faster; the one used)
    n_train_pairs: int = 0  # filled in by training
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_choice("model type", self.model_type, MODEL_TYPES)
        _check_choice("task", self.task, TASKS)
        _check_choice("preset", self.preset, PRESETS)
        _check_choice("loss", self.loss, LOSSES)
        _check_choice("head", self.head, HEADS)
        _check_choice("precision", self.precision, PRECISIONS)
        if (self.loss in CROSSENCODER_LOSSES) != (self.model_type == "crossencoder"):
            wanted = "bce or listwise" if self.model_type == "crossencoder" else "contrastive or mnrl"
            raise MedfaqError(f"loss {self.loss!r} does not fit a {self.model_type}; use {wanted}")
        if self.loss == "listwise" and self.task != "faq":
            raise MedfaqError("the listwise loss ranks each query's mined candidates: it needs --task faq")
        if self.sibling_negatives and self.task != "mqp":
            raise MedfaqError("--sibling-negatives pairs the rewrites of an MQP question: it needs --task mqp")
        if self.faq_synonyms != "none" and self.task != "faq":
            raise MedfaqError("--synonyms reads FAQs as a synonym index shows them to a reranker: it needs --task faq")
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

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / CONFIG_FILE
        path.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")
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
    return EncoderTrainConfig(model_type=model_type, task=task, preset=preset, **settings)


def with_overrides(config: EncoderTrainConfig, **overrides: Any) -> EncoderTrainConfig:
    return replace(config, **{key: value for key, value in overrides.items() if value is not None})


def subsample(items: Sequence[T], limit: int | None, seed: int) -> list[T]:
    """`items` in a seeded random order, at most `limit` of them."""
    order = list(items)
    random.Random(seed).shuffle(order)
    return order[:limit] if limit else order


def _spread(groups: list[list[T]]) -> list[T]:
    """Merge lists so that each is spread evenly over the result (its i-th item at about i / len)."""
    keyed = [((i + 0.5) / len(group), g, example) for g, group in enumerate(groups) for i, example in enumerate(group)]
    keyed.sort(key=lambda item: item[:2])
    return [example for *_, example in keyed]


def _distinct_batches(order: list[T], batch_size: int, keys: Callable[[T], Iterable[str]]) -> list[list[T]]:
    """Fill batches in `order`, deferring an example to a later batch when one of its keys is already in this one."""
    batches, pending = [], order
    while pending:
        batch, seen, deferred = [], set(), []
        for example in pending:
            example_keys = set(keys(example))
            if len(batch) < batch_size and seen.isdisjoint(example_keys):
                batch.append(example)
                seen |= example_keys
            else:
                deferred.append(example)
        batches.append(batch)
        pending = deferred
    return batches


def make_batches(
    examples: Sequence[T],
    batch_size: int,
    rng: random.Random,
    label: Callable[[T], int] | None = None,
    length: Callable[[T], int] | None = None,
    pool: int = 32,
    distinct: Callable[[T], Iterable[str]] | None = None,
) -> list[list[T]]:
    """One epoch of batches in random order. `label`: every batch holds the labels in about their overall proportion.
    `length`: within pools of `pool` batches, examples of similar length share a batch (less padding). `distinct`:
    no two examples of a batch share a key (in-batch negatives that would be duplicates of a positive)."""
    order = list(examples)
    rng.shuffle(order)
    if distinct is not None:
        return _distinct_batches(order, batch_size, distinct)
    by_label: dict[int, list[T]] = {}
    for example in order:
        by_label.setdefault(label(example) if label else 0, []).append(example)
    order = _spread(list(by_label.values()))
    batches = []
    for start in range(0, len(order), batch_size * pool):
        chunk = order[start : start + batch_size * pool]
        if length is not None:
            groups: dict[int, list[T]] = {}
            for example in chunk:
                groups.setdefault(label(example) if label else 0, []).append(example)
            chunk = _spread([sorted(group, key=length) for group in groups.values()])
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


def train_loop(
    model: Any,
    loss_fn: Callable[[list[T]], Any],
    examples: Sequence[T],
    config: EncoderTrainConfig,
    desc: str = "training",
    dev_score: Callable[[], float] | None = None,
    label: Callable[[T], int] | None = None,
    length: Callable[[T], int] | None = None,
    distinct: Callable[[T], Iterable[str]] | None = None,
) -> dict[str, Any]:
    """Minimise ``loss_fn(batch)`` over shuffled batches of `examples` with AdamW and linear warm-up/decay.

    `label`, `length` and `distinct` shape the batches (:func:`make_batches`: label-balanced, similar lengths, no
    shared keys). `dev_score`
    (higher = better) runs after every epoch; the weights of the best epoch are restored at the end, then moved back
    towards the weights `model` had on entry, keeping `config.keep_ratio` of the change (:func:`interpolate_weights`).
    Returns the history: mean loss and dev score per epoch, the best epoch (1-based) and the training seconds. `model`
    is a torch module (put into train mode here, eval mode at the end). The forward passes run in
    `config.precision`, resolved here (``auto``: bf16 where this machine measures it faster) and written back.
    """
    import time

    import torch
    from transformers import get_linear_schedule_with_warmup

    if not examples:
        raise MedfaqError("no training examples")
    seed_everything(config.seed)
    device = next(model.parameters()).device.type
    config.precision = resolve_precision(config.precision, device)
    start = copy_weights(model) if config.keep_ratio < 1 else None
    steps_per_epoch = (len(examples) + config.batch_size - 1) // config.batch_size
    total = steps_per_epoch * config.epochs
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    no_decay = [p for name, p in trainable if name.endswith("bias") or "LayerNorm" in name]
    decay = [p for name, p in trainable if not (name.endswith("bias") or "LayerNorm" in name)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
    )
    scheduler = get_linear_schedule_with_warmup(optimizer, int(total * config.warmup_ratio), total)
    rng = random.Random(config.seed)
    history: dict[str, Any] = {"epoch_loss": [], "dev_score": [], "best_epoch": config.epochs}
    best_state, best_score = None, float("-inf")
    started = time.perf_counter()
    with tqdm(total=total, desc=desc, unit="step") as bar:
        for epoch in range(config.epochs):
            model.train()
            losses: list[float] = []
            for batch in make_batches(examples, config.batch_size, rng, label, length, distinct=distinct):
                with autocast(config.precision, device):
                    loss = loss_fn(batch)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                losses.append(float(loss.item()))
                bar.update(1)
                bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.4f}")
            history["epoch_loss"].append(sum(losses) / len(losses))
            if dev_score is not None:
                model.eval()
                score = dev_score()
                history["dev_score"].append(score)
                logger.info("epoch %d: loss %.4f, dev %.4f", epoch + 1, history["epoch_loss"][-1], score)
                if score > best_score:
                    best_score, history["best_epoch"] = score, epoch + 1
                    if epoch + 1 < config.epochs:
                        best_state = copy_weights(model)
                    else:
                        best_state = None  # the current weights are the best
    if best_state is not None:
        model.load_state_dict(best_state)
    if start is not None:
        interpolate_weights(model, start, config.keep_ratio)
    model.eval()
    history["train_s"] = time.perf_counter() - started
    logger.info("trained %d steps; best epoch %d", total, history["best_epoch"])
    return history


def copy_weights(model: Any) -> dict[str, Any]:
    """A detached copy of `model`'s state dict (to restore with ``load_state_dict`` or interpolate towards)."""
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def interpolate_weights(model: Any, start: dict[str, Any], keep_ratio: float) -> None:
    """Move `model`'s floating-point weights back towards `start` (its state before fine-tuning), keeping
    `keep_ratio` of the change: a weight-space ensemble of the two models (WiSE-FT, Wortsman et al., CVPR 2022)."""
    if keep_ratio >= 1:
        return
    state = model.state_dict()
    merged = {
        name: start[name] + keep_ratio * (value - start[name]) if value.is_floating_point() else value
        for name, value in state.items()
    }
    model.load_state_dict(merged)


def split_dev(pairs: Sequence[T], fraction: float, seed: int) -> tuple[list[T], list[T]]:
    """(train, dev): about `fraction` of the pairs' groups (``group``, else ``text_a``) as a dev part."""
    from sklearn.model_selection import GroupShuffleSplit

    pairs = list(pairs)
    groups = [getattr(p, "group", "") or getattr(p, "text_a", "") for p in pairs]
    if len(set(groups)) < 2:
        raise MedfaqError("carving a dev part needs pairs from at least two groups")
    train, dev = next(GroupShuffleSplit(n_splits=1, test_size=fraction, random_state=seed).split(pairs, groups=groups))
    return [pairs[i] for i in train], [pairs[i] for i in dev]


def save_trained(model: Any, config: EncoderTrainConfig, out: str | Path) -> Path:
    """Save a trained model (safetensors + tokenizer), its config and (a reranker trained as a correction of a
    bi-encoder) that bi-encoder into `out`."""
    from medfaq.retriever.crossencoder import save_prior

    out = Path(out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    model.save(str(out))
    save_prior(config, out)
    config.save(out)
    logger.info("saved %s to %s", config.model_type, out)
    return out
