"""Bi-encoder training: a sentence-transformers model fine-tuned on labelled pairs with ContrastiveLoss (cosine
distance, margin 0.3) or MultipleNegativesRankingLoss over (anchor, positive, hard negative) triplets."""

from __future__ import annotations

from collections.abc import Sequence

from medfaq.retriever.biencoder.scorer import BiEncoderScorer, load_biencoder
from medfaq.retriever.training.config import EncoderTrainConfig
from medfaq.retriever.training.loop import train_loop
from medfaq.retriever.training.pair_data import Pair, mnrl_triplets, normalise


def train_biencoder(pairs: Sequence[Pair], config: EncoderTrainConfig, device: str | None = None):
    """Fine-tune `config.init` on `pairs` with `config.loss` (texts cut at `config.max_length` tokens), keeping
    `config.keep_ratio` of the change to its weights; returns the SentenceTransformer (eval mode), reading as many
    tokens as `config.init` did."""
    import torch
    from sentence_transformers.sentence_transformer import losses
    from sentence_transformers.util import batch_to_device

    model = load_biencoder(config.init, device)
    inference_length = model.max_seq_length  # training truncates at config.max_length; the saved model reads as far
    model.max_seq_length = config.max_length or inference_length  # as the model it started from

    def features(texts: list[str]) -> dict:
        return batch_to_device(model.preprocess(texts), model.device)

    if config.loss == "contrastive":
        loss = losses.ContrastiveLoss(
            model, distance_metric=losses.SiameseDistanceMetric.COSINE_DISTANCE, margin=config.margin
        )
        examples: Sequence = pairs

        def step(batch: list[Pair]):
            labels = torch.tensor([pair.label for pair in batch], device=model.device)
            return loss([features([p.text_a for p in batch]), features([p.text_b for p in batch])], labels)

    else:
        loss = losses.MultipleNegativesRankingLoss(model)
        examples = mnrl_triplets(pairs, BiEncoderScorer(model).encode)

        def step(batch: list[tuple[str, str, str]]):
            columns = [features([triplet[i] for triplet in batch]) for i in range(3)]
            return loss(columns, torch.zeros(len(batch), device=model.device))

    distinct = (lambda triplet: map(normalise, triplet)) if config.loss == "mnrl" else None

    def question_chars(example) -> int:  # the question is the column whose padding costs most
        return len(example[0] if config.loss == "mnrl" else example.text_a)

    length = question_chars if config.length_buckets else None
    train_loop(model, step, examples, config, desc=f"bi-encoder ({config.loss})", length=length, distinct=distinct)
    model.max_seq_length = inference_length
    return model
