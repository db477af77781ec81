"""A thin sentence encoder over SentenceTransformer: offline model names, device choice, normalised float32 batches."""

from __future__ import annotations

import logging

import numpy as np

from index.runtime import DEFAULT_ENCODER, choose_device, resolve_model

logger = logging.getLogger("medfaq.encoder")


class Encoder:
    """Encodes texts into L2-normalised float32 vectors.

    `name` is what the user passed (``"minilm"``, a directory, a hub id); it is recorded in the index manifest,
    so an index is only searched with the encoder that built it.
    """

    def __init__(self, name: str | None = None, device: str | None = None, batch_size: int = 64) -> None:
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        if not logger.isEnabledFor(logging.INFO):
            hf_logging.disable_progress_bar()  # the per-load "Loading weights" bar
        self.name = str(name or DEFAULT_ENCODER)
        self.device = choose_device(device)
        self.batch_size = batch_size
        self.model = SentenceTransformer(resolve_model(self.name), device=self.device)
        self.dim = int(self.model.get_embedding_dimension())
        logger.info("encoder %s (dim %d) on %s", self.name, self.dim, self.device)

    @property
    def max_seq_length(self) -> int:
        return int(self.model.max_seq_length)

    def encode(self, texts: list[str], progress: bool = False) -> np.ndarray:
        """(len(texts), dim) float32, unit-norm rows; a tqdm bar when `progress`."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            show_progress_bar=progress,
            convert_to_numpy=True,
            normalize_embeddings=True,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)
