"""The cross-encoder's training losses, each a callable over one batch of training examples: the logits of its
pairs (the first text cut to fit, each pair's prior offset added for a correction of a bi-encoder) against the
labels (:class:`BinaryCrossEntropyLoss`) or against the positive of each query's group (:class:`ListwiseSoftmaxLoss`).
`retriever.reranker.training` picks one by ``EncoderTrainConfig.loss``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from medfaq.retriever.reranker.model import truncate_first
from medfaq.retriever.training.pair_data import Pair


def pair_logits(model, pairs: Sequence[tuple[str, str]], max_length: int) -> torch.Tensor:
    """The cross-encoder's raw scores (logits) of `pairs`, with gradients, the first text cut to fit."""
    from sentence_transformers.util import batch_to_device

    fitted = truncate_first(model.tokenizer, pairs, max_length)
    features = batch_to_device(model.preprocess(fitted), model.device)
    return model(features)["scores"].view(-1)


def prior_logits(
    model, pairs: Sequence[tuple[str, str]], max_length: int, offsets: dict[tuple[str, str], float]
) -> torch.Tensor:
    """:func:`pair_logits` in float32 plus each pair's prior offset
    (:func:`retriever.reranker.training.training_prior`; none without a prior)."""
    logits = pair_logits(model, pairs, max_length).float()
    if not offsets:
        return logits
    return logits + torch.tensor([offsets[pair] for pair in pairs], device=logits.device)


class PairLoss:
    """A loss over batches of the cross-encoder `model`'s training examples; pairs cut to `max_length` tokens, with
    the prior `offsets` of a correction added to their logits."""

    def __init__(self, model, max_length: int, offsets: dict[tuple[str, str], float]) -> None:
        self.model = model
        self.max_length = max_length
        self.offsets = offsets

    def logits(self, pairs: Sequence[Pair]) -> torch.Tensor:
        return prior_logits(self.model, [(p.text_a, p.text_b) for p in pairs], self.max_length, self.offsets)


class BinaryCrossEntropyLoss(PairLoss):
    """Binary cross-entropy of each labelled pair's logit (loss ``bce``)."""

    def __call__(self, batch: list[Pair]) -> torch.Tensor:
        labels = torch.tensor([pair.label for pair in batch], dtype=torch.float32, device=self.model.device)
        return torch.nn.functional.binary_cross_entropy_with_logits(self.logits(batch), labels)


class ListwiseSoftmaxLoss(PairLoss):
    """Softmax cross-entropy over each group ``[positive, *negatives]`` of a query, the positive first (loss
    ``listwise``)."""

    def __call__(self, batch: list[list[Pair]]) -> torch.Tensor:
        logits = self.logits([pair for group in batch for pair in group])
        rows = torch.split(logits, [len(group) for group in batch])
        padded = torch.nn.utils.rnn.pad_sequence(list(rows), batch_first=True, padding_value=float("-inf"))
        first = torch.zeros(len(batch), dtype=torch.long, device=self.model.device)
        return torch.nn.functional.cross_entropy(padded, first)
