"""What every cross-encoder reranker shares, whatever runs it (PyTorch: retriever/reranker/model.py; ONNX Runtime:
retriever/reranker/onnx.py): the saved model's layout, its decision boundary, the first stage its abstention
threshold is calibrated behind, the query-side cut of a long pair, and the scoring of pairs (both orders for a
symmetric task, a prior bi-encoder's cosine added for a correction).

Imports neither torch nor transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from medfaq.common.model_kinds import CROSSENCODER, check_model_kind
from medfaq.common.runtime import MedfaqError, resolve_model

if TYPE_CHECKING:
    from medfaq.retriever.biencoder.scorer import BiEncoderScorer
    from medfaq.retriever.training.config import EncoderTrainConfig

PRIOR_DIR = "prior"  # a reranker trained as a correction of a bi-encoder keeps that bi-encoder here


def trained_crossencoder(model: str | Path) -> Path:
    """The directory of the cross-encoder `model` names (any name `resolve_model` accepts), or a one-line error for
    a directory that holds no model or a model of another kind (a bi-encoder, a plain encoder without a
    classification head, a summarizer), read from its files before any model library loads."""
    path = Path(resolve_model(model))
    if path.is_dir() and not (path / "config.json").is_file():
        raise MedfaqError(f"reranker {path} is not a model directory (no config.json)")
    check_model_kind(path, CROSSENCODER, f"reranker {path}", plain=False)
    return path


def decision_boundary(config: EncoderTrainConfig) -> float:
    """The score at which a cross-encoder's trained logit is 0, where it tells a match from a non-match on its own:
    0.5 for a probability; for a correction of a prior, the prior's median training cosine
    (:func:`retriever.reranker.training.training_prior`)."""
    return float(config.extra.get("prior_median", 0.5)) if config.prior_scale else 0.5


def calibration_first_stage(config: EncoderTrainConfig) -> str:
    """The encoder a reranker's abstention threshold is calibrated behind (:mod:`retriever.decisions.abstention`): the
    bi-encoder it corrects (its prior), else the one that mined its negatives."""
    return config.prior_model if config.prior_scale else config.negatives_encoder


def cut_first(
    pairs: Sequence[tuple[str, str]],
    first_offsets: Sequence[Sequence[tuple[int, int]]],
    second_lengths: Sequence[int],
    room: int,
) -> list[tuple[str, str]]:
    """Each pair with its first text cut (at the end of a token, by the character offsets of its tokens) so that
    both texts' tokens fit `room` (the max length less the special tokens); a second text too long to fit alone is
    left to the tokenizer's truncation."""
    fitted = []
    for (a, b), offsets, second in zip(pairs, first_offsets, second_lengths, strict=True):
        keep = room - second
        if len(offsets) > keep > 0:
            a = a[: offsets[keep - 1][1]]
        fitted.append((a, b))
    return fitted


class PairReranker:
    """Scores text pairs: probabilities in [0, 1], higher = the same question / a match; subclasses give
    :meth:`_predict`, the model's score of each pair (its logit when a `prior` corrects it).

    `symmetric` (a task where the pair order carries no meaning, e.g. MQP) scores both orders and averages them.
    With a `prior` bi-encoder (a reranker trained as a correction of it, ``--prior-scale``), a score is the prior's
    cosine plus the cross-encoder's logit divided by `prior_scale`: the first stage's score, corrected.
    `decision_boundary`: the score at which the trained logit is 0 (:func:`decision_boundary`)."""

    def __init__(
        self,
        name: str = "",
        symmetric: bool = False,
        prior: BiEncoderScorer | None = None,
        prior_scale: float = 0.0,
        decision_boundary: float = 0.5,
    ) -> None:
        self.name = name
        self.symmetric = symmetric
        self.prior = prior
        self.prior_scale = prior_scale
        self.decision_boundary = decision_boundary

    @property
    def corrects_first_stage(self) -> bool:
        """True for a reranker trained as a correction of a bi-encoder: its scores are that cosine, corrected."""
        return self.prior is not None

    def score(self, query: str, candidates: list[str]) -> list[float]:
        """How well each candidate matches `query`, higher = better (pipeline `Reranker` protocol)."""
        return self.score_pairs([(query, candidate) for candidate in candidates]).tolist()

    def score_pairs(self, pairs: Sequence[tuple[str, str]], progress: bool = False) -> np.ndarray:
        """Scores of many (text_a, text_b) pairs: probabilities, or with a prior its corrected cosines."""
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        scores = self._predict(pairs, progress)
        if self.symmetric:
            scores = (scores + self._predict([(b, a) for a, b in pairs], progress)) / 2
        if self.prior is not None:
            scores = self.prior.score_pairs(pairs) + scores / self.prior_scale
        return scores

    def _predict(self, pairs: Sequence[tuple[str, str]], progress: bool) -> np.ndarray:
        """float32 score of each pair: the probability, or with a prior the logit."""
        raise NotImplementedError
