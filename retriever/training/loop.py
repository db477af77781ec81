"""The training loop both encoders share: batches, AdamW with linear warm-up/decay, best epoch on a dev part,
the weight interpolation of a keep ratio."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from tqdm.auto import tqdm

from medfaq.common.runtime import MedfaqError, autocast, release_freed_memory, resolve_precision, seed_everything
from medfaq.retriever.training.config import EncoderTrainConfig

logger = logging.getLogger("medfaq.training")

T = TypeVar("T")


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
        if length is None:
            return _distinct_batches(order, batch_size, distinct)
        pools = [order[start : start + batch_size * pool] for start in range(0, len(order), batch_size * pool)]
        batches = [
            batch for chunk in pools for batch in _distinct_batches(sorted(chunk, key=length), batch_size, distinct)
        ]
        rng.shuffle(batches)
        return batches
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
    shared keys). `dev_score` (higher = better) runs after every epoch; the weights of the best epoch are restored at
    the end, then moved back towards the weights `model` had on entry, keeping `config.keep_ratio` of the change
    (:func:`interpolate_weights`). Returns the history: mean loss and dev score per epoch, the best epoch (1-based),
    the steps and the training seconds. `model` is a torch module (put into train mode here, eval mode at the end).
    The forward passes run in `config.precision`, resolved here (``auto``: bf16 where this machine measures it
    faster) and written back.
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
    rng = random.Random(config.seed)
    epochs = [  # built first: keeping a batch's texts distinct can add batches, and the schedule counts them all
        make_batches(examples, config.batch_size, rng, label, length, distinct=distinct) for _ in range(config.epochs)
    ]
    total = sum(map(len, epochs))
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    no_decay = [p for name, p in trainable if name.endswith("bias") or "LayerNorm" in name]
    decay = [p for name, p in trainable if not (name.endswith("bias") or "LayerNorm" in name)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
    )
    scheduler = get_linear_schedule_with_warmup(optimizer, int(total * config.warmup_ratio), total)
    history: dict[str, Any] = {"epoch_loss": [], "dev_score": [], "best_epoch": config.epochs, "steps": total}
    best_state, best_score = None, float("-inf")
    started = time.perf_counter()
    with tqdm(total=total, desc=desc, unit="step") as bar:
        for epoch, batches in enumerate(epochs):
            model.train()
            losses: list[float] = []
            for batch in batches:
                with autocast(config.precision, device):
                    loss = loss_fn(batch)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                release_freed_memory()
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
