"""One entry point for both duplicate-detector kinds: train a model from an :class:`EncoderTrainConfig`, save it,
load a trained one as a pair scorer (``score_pairs(pairs) -> np.ndarray``, higher = more likely the same question)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from medfaq.common.model_kinds import BIENCODER, CROSSENCODER, STUDENT, check_model_kind, model_kind
from medfaq.common.runtime import resolve_model
from medfaq.retriever.biencoder.scorer import BiEncoderScorer, load_biencoder
from medfaq.retriever.biencoder.training import train_biencoder
from medfaq.retriever.reranker.base import decision_boundary
from medfaq.retriever.reranker.model import CrossEncoderReranker
from medfaq.retriever.reranker.training import initial_crossencoder, save_prior, shared_prior, train_crossencoder
from medfaq.retriever.training.config import CONFIG_FILE, EncoderTrainConfig
from medfaq.retriever.training.pair_data import Pair, mqp_sibling_negatives

logger = logging.getLogger("medfaq.training")


class PairScorer(Protocol):
    def score_pairs(self, pairs: Sequence[tuple[str, str]], progress: bool = False) -> np.ndarray: ...


def train_pair_model(
    pairs: Sequence[Pair], config: EncoderTrainConfig, device: str | None = None, dev: Sequence[Pair] | None = None
):
    """Train the model `config.model_type` names; returns the sentence-transformers model object. A cross-encoder
    keeps its best epoch on `dev` (else on a dev part carved from `pairs`, see `config.dev_fraction`)."""
    pairs = training_pairs(pairs, config)
    if config.model_type == "crossencoder":
        return train_crossencoder(pairs, config, device, dev)
    return train_biencoder(pairs, config, device)


def training_pairs(pairs: Sequence[Pair], config: EncoderTrainConfig) -> list[Pair]:
    """`pairs` and, with `config.sibling_negatives`, their MQP sibling negatives (:func:`mqp_sibling_negatives`)."""
    return [*pairs, *mqp_sibling_negatives(pairs)] if config.sibling_negatives else list(pairs)


def initial_weights(pairs: Sequence[Pair], config: EncoderTrainConfig, device: str | None = None) -> dict:
    """The weights `train_pair_model(pairs, config)` starts from (what its keep ratio moves back towards)."""
    if config.model_type == "crossencoder":
        return initial_crossencoder(training_pairs(pairs, config), config, device).state_dict()
    return load_biencoder(config.init, device).state_dict()


def as_scorer(model, config: EncoderTrainConfig) -> PairScorer:
    """Wrap a freshly trained model as a pair scorer."""
    if config.model_type == "crossencoder":
        prior = shared_prior(config.prior_model, str(model.device)) if config.prior_scale else None
        return CrossEncoderReranker(
            model,
            symmetric=config.symmetric,
            prior=prior,
            prior_scale=config.prior_scale,
            decision_boundary=decision_boundary(config),
        )
    return BiEncoderScorer(model)


def model_type_of(model: str | Path) -> str:
    """``crossencoder`` or ``biencoder`` (a student is one), as the model's directory says (common/model_kinds.py);
    a summarizer or question writer is a one-line error, a plain encoder a bi-encoder."""
    path = Path(resolve_model(model))
    check_model_kind(path, (BIENCODER, STUDENT, CROSSENCODER), model)
    return CROSSENCODER if model_kind(path) == CROSSENCODER else BIENCODER


def load_pair_scorer(model: str | Path, device: str | None = None, quantize: bool = False) -> PairScorer:
    """A trained bi-encoder or cross-encoder as a pair scorer; `quantize` = int8 dynamic quantisation (CPU)."""
    scorer = CrossEncoderReranker if model_type_of(model) == "crossencoder" else BiEncoderScorer
    return scorer.load(model, device=device, quantize=quantize)


def saved_threshold(model: str | Path, default: float = 0.5) -> float:
    """The best-accuracy threshold saved with a cross-validation fold model; else a cross-encoder's own decision
    boundary (:func:`retriever.reranker.base.decision_boundary`); else `default`."""
    path = Path(resolve_model(model))
    if not (path / CONFIG_FILE).is_file():
        return default
    config = EncoderTrainConfig.load(path)
    if "threshold_accuracy" in config.extra:
        return float(config.extra["threshold_accuracy"])
    return decision_boundary(config) if config.model_type == "crossencoder" else default


def save_trained(model: Any, config: EncoderTrainConfig, out: str | Path) -> Path:
    """Save a trained model (safetensors + tokenizer), its config and (a reranker trained as a correction of a
    bi-encoder) that bi-encoder into `out`."""
    out = Path(out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    model.save(str(out))
    save_prior(config, out)
    config.save(out)
    logger.info("saved %s to %s", config.model_type, out)
    return out
