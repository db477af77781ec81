"""A trained cross-encoder's ONNX export run with `onnxruntime` + `tokenizers` alone: (text_a, text_b) pairs ->
logits, cut to fit as the PyTorch reranker cuts them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from medfaq.index.onnx_graph import TOKENIZER_FILE, OnnxGraph
from medfaq.retriever.reranker import cut_first


class OnnxPairModel:
    """An exported cross-encoder: (text_a, text_b) pairs -> logits; `max_length` tokens per pair (None: the length
    it was trained with), the first text cut to fit as :func:`retriever.crossencoder.truncate_first` cuts it."""

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
