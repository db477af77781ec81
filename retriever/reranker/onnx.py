"""The cross-encoder reranker on ONNX Runtime: a trained cross-encoder exported once (:func:`export_crossencoder`,
cached in ``medfaq-onnx`` inside the model's directory) and run with `onnxruntime` + `tokenizers` alone, so a
reranked search imports neither torch, transformers nor sentence-transformers.

The export (needs torch; runs once per model): the whole module chain (the transformer and its head, SegmentCosine
included) becomes one ONNX graph from token ids to the logit, fused by ONNX Runtime's transformer optimizer like the
bi-encoder's (index/onnx/export.py), and quantised to int8 the first time ``--quantize`` asks for it. Before the
export is kept, its logits of probe pairs (cut as the reranker cuts them) are compared with PyTorch's; a fused graph
that drifts is replaced by the plain one.

It scores as :class:`retriever.reranker.model.CrossEncoderReranker` does: the query cut to fit the max length with
the FAQ whole, both orders for a symmetric model, the model's activation (sigmoid) on the logit, and for a reranker
trained as a correction of a bi-encoder (``prior/``) that bi-encoder's cosine, from its own ONNX export
(index/onnx/encoder.py), plus the logit over ``prior_scale``. ``quantize`` runs the int8 graphs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from medfaq.common.runtime import MedfaqError
from medfaq.index.onnx.encoder import OnnxEncoder
from medfaq.index.onnx.export import ensure_export, finish_export, trace_export
from medfaq.index.onnx.graph import TOKENIZER_FILE, ExportInfo, OnnxGraph
from medfaq.retriever.reranker.base import PRIOR_DIR, PairReranker, cut_first, decision_boundary, trained_crossencoder

logger = logging.getLogger("medfaq.crossencoder")

TOLERANCE = 1e-4  # largest difference from PyTorch's logits an fp32 export may show
PROBES = [
    ("What are the symptoms of type 2 diabetes?", "What are the signs of diabetes?"),
    ("  CAN I take IBUPROFEN with   amoxicillin?? ", "Is it safe to combine painkillers and antibiotics?"),
    ("", "What is shingles?"),
    ("什么是糖尿病 😀", "What is diabetes?"),
    ("my doctor said " * 60 + "is shingles contagious?", "Can I catch shingles from someone?"),  # the query cut
    ("Is shingles contagious?", "shingles " * 400),  # an FAQ longer than the model reads
]
"""Pairs the export is checked on: ordinary, odd spacing and case, empty, non-Latin, too long on either side."""
ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "identity"}


def export_crossencoder(location: str, out: Path) -> None:
    """Export the cross-encoder saved at `location` into the new directory `out`."""
    import torch

    from medfaq.retriever.reranker.model import load_crossencoder

    model = load_crossencoder(location, device="cpu")
    activation = ACTIVATIONS.get(type(model.activation_fn).__name__)
    tokenizer = model.tokenizer
    if activation is None or getattr(tokenizer, "backend_tokenizer", None) is None:
        raise MedfaqError(
            f"reranker {location} has no fast (Rust) tokenizer or an activation other than sigmoid; "
            "rerank with --encoder-backend torch"
        )
    pairs = _fitted_probes(model)
    features = model.preprocess(pairs[:2])
    raw, info = trace_export(model, tokenizer, features, location, out, 1, output="scores", activation=activation)
    expected = model.predict(pairs, activation_fn=torch.nn.Identity(), convert_to_numpy=True).reshape(-1)
    failure = f"the ONNX export of reranker {location} differs from PyTorch by {{drift:.2g}}"
    config = model[0].model.config
    drift = finish_export(raw, info, config, lambda: _drift(out, info, expected), failure, TOLERANCE)
    logger.info("exported reranker %s to ONNX in %s (fp32 logits within %.1g of PyTorch)", location, out, drift)


def _fitted_probes(model) -> list[tuple[str, str]]:
    from medfaq.retriever.reranker.model import truncate_first

    return truncate_first(model.tokenizer, PROBES, model.max_seq_length)


def _drift(directory: Path, info: ExportInfo, expected: np.ndarray) -> float:
    """Largest absolute difference between the fp32 graph's logits of the probes and `expected`."""
    info.save(directory)
    logits = OnnxPairModel(directory, "fp32").logits(PROBES)
    return float(np.abs(logits - expected).max())


class OnnxPairModel:
    """An exported cross-encoder: (text_a, text_b) pairs -> logits; `max_length` tokens per pair (None: the length
    it was trained with), the first text cut to fit as :func:`retriever.reranker.model.truncate_first` cuts it."""

    def __init__(
        self,
        directory: Path,
        precision: str = "fp32",
        max_length: int | None = None,
        batch_size: int = 32,
        name: str = "",
    ) -> None:
        from tokenizers import Tokenizer

        self.graph = OnnxGraph(directory, precision, name=name)
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
    """A trained cross-encoder on ONNX Runtime as a :class:`~retriever.reranker.base.PairReranker`."""

    def __init__(self, model: OnnxPairModel, name: str = "", **scoring) -> None:
        super().__init__(name, **scoring)
        self.model = model

    @classmethod
    def load(
        cls, model: str | Path, quantize: bool = False, batch_size: int = 32, max_length: int | None = None
    ) -> OnnxReranker:
        """The reranker saved at `model` (any name `resolve_model` accepts), exported on first use (with torch);
        `quantize`: the int8 graphs; `max_length`: tokens per pair (None = the trained length)."""
        from medfaq.retriever.biencoder.scorer import BiEncoderScorer
        from medfaq.retriever.training.config import CONFIG_FILE, EncoderTrainConfig

        path = trained_crossencoder(model)
        config = EncoderTrainConfig.load(path) if (path / CONFIG_FILE).is_file() else EncoderTrainConfig()
        precision = "int8" if quantize else "fp32"
        export = ensure_export(str(path), export_crossencoder, precision)
        pairs = OnnxPairModel(export, precision, max_length, batch_size, name=f"reranker {model}")
        prior = BiEncoderScorer(OnnxEncoder(str(path / PRIOR_DIR), precision)) if config.prior_scale else None
        scoring = {"symmetric": config.symmetric, "prior": prior, "prior_scale": config.prior_scale}
        return cls(pairs, str(model), decision_boundary=decision_boundary(config), **scoring)

    def _predict(self, pairs: Sequence[tuple[str, str]], progress: bool) -> np.ndarray:
        logits = self.model.logits(pairs)
        if self.prior is not None or self.model.activation == "identity":
            return logits
        return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
