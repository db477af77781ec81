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
from medfaq.index.onnx_encoder import TOKENIZER_FILE, OnnxEncoder, OnnxGraph, ensure_export
from medfaq.retriever.reranker import PRIOR_DIR, PairReranker, cut_first, decision_boundary


class OnnxPairModel:
    """An exported cross-encoder: (text_a, text_b) pairs -> logits; `max_length` tokens per pair (None: the length
    it was trained with), the first text cut to fit as :func:`retriever.crossencoder.truncate_first` cuts it."""

    def __init__(
        self, directory: Path, precision: str = "fp32", max_length: int | None = None, batch_size: int = 32
    ) -> None:
        from tokenizers import Tokenizer

        self.graph = OnnxGraph(directory, precision)
        self.max_length = max_length or self.graph.info.max_seq_length
        self.graph.tokenizer.enable_truncation(self.max_length)
        self.measure = Tokenizer.from_file(str(directory / TOKENIZER_FILE))  # texts alone, neither cut nor padded
        processor = self.measure.post_processor
        self.special = processor.num_special_tokens_to_add(True) if processor is not None else 0
        self.activation = self.graph.info.activation
        self.batch_size = batch_size

    def fit(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        firsts = self.measure.encode_batch([str(a) for a, _ in pairs], add_special_tokens=False)
        seconds = self.measure.encode_batch([str(b) for _, b in pairs], add_special_tokens=False)
        plain = [(str(a), str(b)) for a, b in pairs]
        room = self.max_length - self.special
        return cut_first(plain, [e.offsets for e in firsts], [len(e.ids) for e in seconds], room)

    def logits(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """float32 logit of each pair, in batches of similar length."""
        fitted = self.fit(pairs)
        logits = np.zeros(len(fitted), dtype=np.float32)
        order = np.argsort([-len(a) - len(b) for a, b in fitted], kind="stable")
        for start in range(0, len(fitted), self.batch_size):
            rows = order[start : start + self.batch_size]
            logits[rows] = self.graph.embed([fitted[row] for row in rows]).reshape(-1)
        return logits


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
        pairs = OnnxPairModel(ensure_export(str(path), export_crossencoder), precision, max_length, batch_size)
        prior = BiEncoderScorer(OnnxEncoder(str(path / PRIOR_DIR), precision)) if config.prior_scale else None
        scoring = {"symmetric": config.symmetric, "prior": prior, "prior_scale": config.prior_scale}
        return cls(pairs, str(model), decision_boundary=decision_boundary(config), **scoring)

    def _predict(self, pairs: Sequence[tuple[str, str]], progress: bool) -> np.ndarray:
        logits = self.model.logits(pairs)
        if self.prior is not None or self.model.activation == "identity":
            return logits
        return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
