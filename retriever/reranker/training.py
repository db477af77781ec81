"""Cross-encoder training: binary cross-entropy on labelled pairs or a listwise softmax over each query's mined
candidates (the losses: :mod:`retriever.reranker.losses`), optionally as a correction of a prior bi-encoder; the
best epoch is kept by a dev score."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from medfaq.common.runtime import MedfaqError, seed_everything
from medfaq.retriever.biencoder.scorer import BiEncoderScorer, load_biencoder
from medfaq.retriever.reranker.base import PRIOR_DIR
from medfaq.retriever.reranker.losses import BinaryCrossEntropyLoss, ListwiseSoftmaxLoss
from medfaq.retriever.reranker.model import CrossEncoderReranker, load_crossencoder, truncate_first
from medfaq.retriever.training.config import EncoderTrainConfig
from medfaq.retriever.training.loop import split_dev, train_loop
from medfaq.retriever.training.pair_data import Pair, ranking_groups

logger = logging.getLogger("medfaq.crossencoder")

LENGTH_PERCENTILE = 99  # the automatic max length covers this percentile of the training pairs' token counts


def measure_max_length(tokenizer, pairs: Sequence[Pair], percentile: float = LENGTH_PERCENTILE) -> int:
    """The `percentile` of the pairs' token counts (with special tokens), rounded up to a multiple of 8, <= 512."""
    sample = list(pairs)[:5000]
    encoded = tokenizer([p.text_a for p in sample], [p.text_b for p in sample], verbose=False)["input_ids"]
    length = float(np.percentile([len(ids) for ids in encoded], percentile))
    return int(min(512, max(16, 8 * np.ceil(length / 8))))


def calibrate_shift(model, pairs: Sequence[Pair], sample: int = 256) -> float:
    """Set a new cosine head's shift to the median cosine of (up to `sample` of) the training pairs, so that
    training starts with half the pairs on each side of the decision boundary; returns the shift."""
    head = model[-1]
    texts = truncate_first(model.tokenizer, [(p.text_a, p.text_b) for p in pairs[:sample]], model.max_seq_length)
    with torch.no_grad():
        head.shift.zero_()
        cosines = model.predict(texts, batch_size=32, activation_fn=torch.nn.Identity()) / float(head.scale)
        shift = float(np.median(cosines))
        head.shift.fill_(shift)
    logger.info("cosine head: shift %.3f", shift)
    return shift


def both_orders(pairs: Sequence[Pair]) -> list[Pair]:
    """Every pair as given and swapped (for symmetric tasks)."""
    return [*pairs, *(replace(pair, text_a=pair.text_b, text_b=pair.text_a) for pair in pairs)]


def initial_crossencoder(pairs: Sequence[Pair], config: EncoderTrainConfig, device: str | None = None):
    """The model `train_crossencoder` starts from: seeded before the head exists, max length measured on `pairs`
    when `config.max_length` is None (and written back into `config`), a cosine head's shift calibrated."""
    seed_everything(config.seed)
    model = load_crossencoder(config.init, device, config.max_length, config.head)
    if config.max_length is None:
        config.max_length = measure_max_length(model.tokenizer, pairs)
        model.max_seq_length = config.max_length
        logger.info(
            "max length %d tokens (%dth percentile of the training pairs)", config.max_length, LENGTH_PERCENTILE
        )
    if config.head == "cosine":
        calibrate_shift(model, pairs)
    return model


def mean_reciprocal_rank(scores: np.ndarray, group_sizes: Sequence[int]) -> float:
    """Mean over groups of 1 / the rank of each group's first item (its positive) among the group's scores."""
    ranks, start = [], 0
    for size in group_sizes:
        group = scores[start : start + size]
        ranks.append(1 + int((group[1:] > group[0]).sum()))
        start += size
    return float(np.mean([1.0 / rank for rank in ranks]))


def train_crossencoder(
    pairs: Sequence[Pair], config: EncoderTrainConfig, device: str | None = None, dev: Sequence[Pair] | None = None
):
    """Fine-tune `config.init` on `pairs`, keeping `config.keep_ratio` of the change to the starting weights (head
    included); returns the CrossEncoder (eval mode).

    `config.loss`: ``bce`` = binary cross-entropy on each labelled pair; ``listwise`` = softmax cross-entropy over
    each query's positive and its mined negatives (:func:`ranking_groups`), the task a reranker faces: pick the
    right FAQ among the retriever's best candidates. The seed is set before the head is created.
    `config.max_length` None = measured on the training pairs (and written back into `config`). With
    `config.dev_fraction` > 0 and no `dev`, a group-disjoint dev part is carved from `pairs`; the epoch with the best
    dev score (ROC AUC; listwise: mean reciprocal rank of the positive in its group) is kept."""
    if dev is None and config.dev_fraction > 0:
        pairs, dev = split_dev(pairs, config.dev_fraction, config.seed)
    model = initial_crossencoder(pairs, config, device)
    task = _listwise_task if config.loss == "listwise" else _pointwise_task
    examples, step, dev_score, shaping = task(model, pairs, dev or [], config)
    history = train_loop(
        model, step, examples, config, desc=f"cross-encoder ({config.loss})", dev_score=dev_score, **shaping
    )
    config.extra = {**config.extra, "history": history}
    return model


def _pointwise_task(model, pairs: Sequence[Pair], dev: Sequence[Pair], config: EncoderTrainConfig):
    """Binary cross-entropy on each pair (both orders when symmetric); dev score: ROC AUC. Label-balanced batches
    of similar lengths."""
    from sklearn.metrics import roc_auc_score

    examples = both_orders(pairs) if config.symmetric else list(pairs)
    prior, offsets = training_prior(config, model, [*examples, *dev])

    step = BinaryCrossEntropyLoss(model, config.max_length, offsets)

    dev_score = None
    if dev:
        scorer = CrossEncoderReranker(model, symmetric=config.symmetric, prior=prior, prior_scale=config.prior_scale)
        dev_texts, dev_labels = [(p.text_a, p.text_b) for p in dev], [p.label for p in dev]

        def dev_score() -> float:
            return float(roc_auc_score(dev_labels, scorer.score_pairs(dev_texts)))

    shaping = {"label": lambda pair: pair.label, "length": lambda pair: len(pair.text_a) + len(pair.text_b)}
    return examples, step, dev_score, shaping


def _listwise_task(model, pairs: Sequence[Pair], dev: Sequence[Pair], config: EncoderTrainConfig):
    """Softmax cross-entropy over each query's group ``[positive, *negatives]``; dev score: mean reciprocal rank of
    the positive in its dev group. Batches of groups of similar lengths.

    With `config.prior_scale` > 0 every logit gets `prior_scale` x the cosine of `config.prior_model` (the
    first stage) added: the cross-encoder is trained as a correction of the first stage's ranking, not as a
    replacement (the prior is saved with the model, see :func:`save_prior`). Its head starts as usual: a head
    started at zero would stay there, since its gradient is what multiplies the encoder's."""
    examples = ranking_groups(pairs)
    if not examples:
        raise MedfaqError("the listwise loss needs queries with a positive and at least one negative")
    prior, offsets = training_prior(config, model, [*pairs, *dev])

    step = ListwiseSoftmaxLoss(model, config.max_length, offsets)

    dev_score = None
    dev_groups = ranking_groups(dev)
    if dev_groups:
        scorer = CrossEncoderReranker(model, prior=prior, prior_scale=config.prior_scale)
        dev_texts = [(pair.text_a, pair.text_b) for group in dev_groups for pair in group]

        def dev_score() -> float:
            return mean_reciprocal_rank(scorer.score_pairs(dev_texts), [len(group) for group in dev_groups])

    shaping = {"length": lambda group: sum(len(pair.text_a) + len(pair.text_b) for pair in group)}
    return examples, step, dev_score, shaping


def training_prior(
    config: EncoderTrainConfig, model, pairs: Sequence[Pair]
) -> tuple[BiEncoderScorer | None, dict[tuple[str, str], float]]:
    """With `config.prior_scale` > 0: the prior bi-encoder (``config.prior_model``) and the offset it adds to the
    logit of each of `pairs`, `prior_scale` x (its cosine - the median cosine of `pairs`). Centred, so that
    training starts with the prior's median pair at logit 0; a constant changes no ranking or threshold, so scoring
    adds the plain cosine, and that median (saved in ``config.extra["prior_median"]``) is where a score's logit
    crosses 0. Without a prior: (None, {})."""
    if not config.prior_scale:
        return None, {}
    prior = shared_prior(config.prior_model, str(model.device))
    texts = list(dict.fromkeys((p.text_a, p.text_b) for p in pairs))
    cosines = prior.score_pairs(texts, progress=True)
    config.extra["prior_median"] = float(np.median(cosines))
    offsets = config.prior_scale * (cosines - config.extra["prior_median"])
    return prior, dict(zip(texts, offsets.tolist(), strict=True))


@functools.lru_cache(maxsize=2)
def shared_prior(name: str, device: str) -> BiEncoderScorer:
    """One prior bi-encoder per (name, device) in a process, remembering every text it encoded: the folds of a
    cross-validation score the same texts again."""
    return BiEncoderScorer(load_biencoder(name, device), remember=True)


def save_prior(config: EncoderTrainConfig, out: str | Path) -> None:
    """Copy the bi-encoder a cross-encoder was trained to correct (``config.prior_model``) into ``out/prior``."""
    if config.prior_scale:
        load_biencoder(config.prior_model, "cpu").save(str(Path(out) / PRIOR_DIR))
