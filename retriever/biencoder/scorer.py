"""The bi-encoder as a pair scorer: a sentence-transformers model; pairs are scored by the cosine similarity of
their embeddings."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from medfaq.common.runtime import choose_device, quantize_linear, resolve_model
from medfaq.index.concepts import ExpandedText, combined_vectors
from medfaq.index.model_files import check_model_directory

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


def load_biencoder(model: str | Path, device: str | None = None, max_length: int | None = None):
    """A SentenceTransformer from any name `resolve_model` accepts (mean pooling is added to a plain encoder); a
    model of another kind (a cross-encoder, a summarizer) is a one-line error."""
    from sentence_transformers import SentenceTransformer

    location = resolve_model(model)
    check_model_directory(location, str(model))
    encoder = SentenceTransformer(location, device=choose_device(device))
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
            quantize_checked(encoder, str(model))
        return cls(encoder)

    def encode(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        """Unit-norm float32 embeddings (`model`: a SentenceTransformer, or an ONNX Runtime encoder)."""
        from medfaq.index.onnx.encoder import OnnxEncoder

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


def quantize_checked(encoder: SentenceTransformer, name: str) -> None:
    """Convert the bi-encoder `encoder`'s linear layers to int8 (PyTorch dynamic quantisation), refused with one line
    where its probe vectors disagree with the fp32 model's (index/onnx/check.py)."""
    from medfaq.index.onnx.check import check_encoder, probe_texts, require_agreement

    def probe_vectors() -> np.ndarray:
        return encoder.encode(probe_texts(), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)

    source = probe_vectors()
    quantize_linear(encoder)
    require_agreement(
        check_encoder("torch-int8", source, probe_vectors()),
        f"the int8 (PyTorch dynamic) bi-encoder {name}",
        "rerank without --quantize",
    )
