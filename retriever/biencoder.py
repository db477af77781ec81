"""The bi-encoder duplicate detector: a sentence-transformers model fine-tuned on labelled pairs with
ContrastiveLoss (cosine distance, margin 0.3) or MultipleNegativesRankingLoss over (anchor, positive, hard negative)
triplets; pairs are scored by the cosine similarity of their embeddings."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from medfaq.common.runtime import choose_device, quantize_linear, resolve_model
from medfaq.index.concepts import ExpandedText, combined_vectors
from medfaq.retriever.training.loop import EncoderTrainConfig, train_loop
from medfaq.retriever.training.pair_data import Pair, mnrl_triplets, normalise


def load_biencoder(model: str | Path, device: str | None = None, max_length: int | None = None):
    """A SentenceTransformer from any name `resolve_model` accepts (mean pooling is added to a plain encoder)."""
    from sentence_transformers import SentenceTransformer

    encoder = SentenceTransformer(resolve_model(model), device=choose_device(device))
    if max_length:
        encoder.max_seq_length = max_length
    return encoder


class BiEncoderScorer:
    """Scores text pairs by the cosine similarity of their embeddings (in [-1, 1], higher = more similar).

    `remember`: keep every text's embedding, so a text is encoded once however often it is scored (training and
    cross-validation over a fixed pair set; not for serving, where the texts never repeat)."""

    def __init__(self, model, batch_size: int = 64, remember: bool = False) -> None:
        self.model = model
        self.batch_size = batch_size
        self._memory: dict[str, np.ndarray] | None = {} if remember else None

    @classmethod
    def load(cls, model: str | Path, device: str | None = None, quantize: bool = False) -> BiEncoderScorer:
        encoder = load_biencoder(model, device="cpu" if quantize else device)
        if quantize:
            quantize_linear(encoder)
        return cls(encoder)

    def encode(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        """Unit-norm float32 embeddings (`model`: a SentenceTransformer, or an ONNX Runtime encoder)."""
        from medfaq.index.onnx_encoder import OnnxEncoder

        if isinstance(self.model, OnnxEncoder):
            return self.model.encode([str(text) for text in texts], progress)
        vectors = self.model.encode(
            list(texts), batch_size=self.batch_size, show_progress_bar=progress, normalize_embeddings=True
        )
        return np.asarray(vectors, dtype=np.float32)

    def score_pairs(self, pairs: Sequence[tuple[str, str]], progress: bool = False) -> np.ndarray:
        """Cosine similarity of every (text_a, text_b); each distinct text is encoded once. An
        :class:`~index.concepts.ExpandedText` gets the vector an index with concepts stores for it."""
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        written = [text.written for pair in pairs for text in pair if isinstance(text, ExpandedText)]
        texts = list(dict.fromkeys([text for pair in pairs for text in pair] + written))
        position = {text: i for i, text in enumerate(texts)}
        vectors = self._vectors(texts, progress)

        def vector(text: str) -> np.ndarray:
            if isinstance(text, ExpandedText):
                return combined_vectors(vectors[position[text.written]], vectors[position[text]])
            return vectors[position[text]]

        a = np.stack([vector(x) for x, _ in pairs])
        b = np.stack([vector(y) for _, y in pairs])
        return np.einsum("ij,ij->i", a, b)

    def _vectors(self, texts: list[str], progress: bool) -> np.ndarray:
        if self._memory is None:
            return self.encode(texts, progress)
        new = [text for text in texts if text not in self._memory]
        if new:
            self._memory.update(zip(new, self.encode(new, progress), strict=True))
        return np.stack([self._memory[text] for text in texts])


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
    train_loop(model, step, examples, config, desc=f"bi-encoder ({config.loss})", distinct=distinct)
    model.max_seq_length = inference_length
    return model
