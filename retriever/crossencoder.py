"""The cross-encoder: MiniLM (or any BERT-like model) with a one-logit classification head over a text pair,
trained with binary cross-entropy; :class:`CrossEncoderReranker` scores (query, FAQ) pairs for the pipeline."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from index.runtime import choose_device, quantize_linear, resolve_model
from retriever.encoder_training import EncoderTrainConfig, train_loop
from retriever.pair_data import Pair

logger = logging.getLogger("medfaq.crossencoder")


def has_classifier_head(path: str) -> bool:
    """True for a saved sequence-classification model (a trained cross-encoder), False for a plain encoder."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    architectures = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
    return any(name.endswith("ForSequenceClassification") for name in architectures)


def load_crossencoder(model: str | Path, device: str | None = None, max_length: int | None = None):
    """A trained cross-encoder, or a plain encoder (e.g. ``minilm``) with a new, randomly initialised one-logit head."""
    from sentence_transformers import CrossEncoder
    from sentence_transformers.base.modules import Transformer

    path = resolve_model(model)
    device = choose_device(device)
    if has_classifier_head(path):
        return CrossEncoder(path, device=device, max_length=max_length)
    processor = {"model_max_length": max_length} if max_length else None
    transformer = Transformer(
        path, transformer_task="sequence-classification", config_kwargs={"num_labels": 1}, processor_kwargs=processor
    )
    return CrossEncoder(modules=[transformer], device=device)


class CrossEncoderReranker:
    """Scores text pairs with a cross-encoder: probabilities in [0, 1], higher = the same question / a match."""

    def __init__(self, model, batch_size: int = 32, name: str = "") -> None:
        self.model = model
        self.batch_size = batch_size
        self.name = name

    @classmethod
    def load(
        cls, model: str | Path, device: str | None = None, quantize: bool = False, batch_size: int = 32
    ) -> CrossEncoderReranker:
        """Load a trained cross-encoder (any name `resolve_model` accepts); `quantize` = int8 dynamic (CPU only)."""
        encoder = load_crossencoder(model, device="cpu" if quantize else device)
        if quantize:
            quantize_linear(encoder)
        return cls(encoder, batch_size=batch_size, name=str(model))

    def score(self, query: str, candidates: list[str]) -> list[float]:
        """Probability that each candidate matches `query` (pipeline `Reranker` protocol)."""
        return self.score_pairs([(query, candidate) for candidate in candidates]).tolist()

    def score_pairs(self, pairs: Sequence[tuple[str, str]], progress: bool = False) -> np.ndarray:
        """Probabilities for many (text_a, text_b) pairs."""
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        scores = self.model.predict(list(pairs), batch_size=self.batch_size, show_progress_bar=progress)
        return np.asarray(scores, dtype=np.float32).reshape(-1)


def train_crossencoder(pairs: Sequence[Pair], config: EncoderTrainConfig, device: str | None = None):
    """Fine-tune `config.init` on `pairs` with binary cross-entropy; returns the CrossEncoder (eval mode)."""
    import torch
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    model = load_crossencoder(config.init, device, config.max_length)
    loss = BinaryCrossEntropyLoss(model)

    def step(batch: list[Pair]):
        labels = torch.tensor([pair.label for pair in batch], dtype=torch.float32, device=model.device)
        return loss([[pair.text_a for pair in batch], [pair.text_b for pair in batch]], labels)

    train_loop(model, step, pairs, config, desc="cross-encoder")
    return model
