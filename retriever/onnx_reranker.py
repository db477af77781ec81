"""The cross-encoder reranker on ONNX Runtime: a trained cross-encoder exported once (retriever/crossencoder_export.py,
cached in ``medfaq-onnx`` inside the model's directory) and run with `onnxruntime` + `tokenizers` alone, so a
reranked search imports neither torch, transformers nor sentence-transformers.

It scores as :class:`retriever.crossencoder.CrossEncoderReranker` does: the query cut to fit the max length with
the FAQ whole, both orders for a symmetric model, the model's activation (sigmoid) on the logit, and for a reranker
trained as a correction of a bi-encoder (``prior/``) that bi-encoder's cosine, from its own ONNX export
(index/onnx_encoder.py), plus the logit over ``prior_scale``. ``quantize`` runs the int8 graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from medfaq.common.runtime import resolve_model
from medfaq.index.onnx_encoder import OnnxEncoder, ensure_export
from medfaq.retriever.onnx_pair_model import OnnxPairModel
from medfaq.retriever.reranker import PRIOR_DIR, PairReranker, decision_boundary


class OnnxReranker(PairReranker):
    """A trained cross-encoder on ONNX Runtime as a :class:`~retriever.reranker.PairReranker`."""

    def __init__(self, model: OnnxPairModel, name: str = "", **scoring) -> None:
        super().__init__(name, **scoring)
        self.model = model

    @classmethod
    def load(
        cls, model: str | Path, quantize: bool = False, batch_size: int = 32, max_length: int | None = None
    ) -> OnnxReranker:
        """The reranker saved at `model` (any name `resolve_model` accepts), exported on first use (with torch);
        `quantize`: the int8 graphs; `max_length`: tokens per pair (None = the trained length)."""
        from medfaq.retriever.biencoder import BiEncoderScorer
        from medfaq.retriever.crossencoder_export import export_crossencoder
        from medfaq.retriever.training.config import CONFIG_FILE, EncoderTrainConfig

        path = Path(resolve_model(model))
        config = EncoderTrainConfig.load(path) if (path / CONFIG_FILE).is_file() else EncoderTrainConfig()
        precision = "int8" if quantize else "fp32"
        export = ensure_export(str(path), export_crossencoder)
        pairs = OnnxPairModel(export, precision, max_length, batch_size, name=f"reranker {model}")
        prior = BiEncoderScorer(OnnxEncoder(str(path / PRIOR_DIR), precision)) if config.prior_scale else None
        scoring = {"symmetric": config.symmetric, "prior": prior, "prior_scale": config.prior_scale}
        return cls(pairs, str(model), decision_boundary=decision_boundary(config), **scoring)

    def _predict(self, pairs: Sequence[tuple[str, str]], progress: bool) -> np.ndarray:
        logits = self.model.logits(pairs)
        if self.prior is not None or self.model.activation == "identity":
            return logits
        return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
