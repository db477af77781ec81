"""The bi-encoder on ONNX Runtime: a sentence-transformers model exported once (index/onnx/export.py) and run with
`onnxruntime` + `tokenizers` alone, so encoding imports neither torch, transformers nor sentence-transformers.

The export holds the whole module chain (Transformer, Pooling, any Dense, Normalize) as one graph, so it gives the
vectors sentence-transformers gives; ``export.json`` beside it records what torch would need to tell: the weights'
fingerprint (:func:`medfaq.index.model_files.model_fingerprint`), the dimension, the tokens read, and the size and
time of every file of the source model, so a retrained model is exported again.

Where the export lives: ``EXPORT_DIR`` inside a writable model directory (a trained model), else a cache under
``$MEDFAQ_HOME/models/onnx`` (the MiniLM shipped in site-packages, hub ids).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from medfaq.common.runtime import DEFAULT_ENCODER, resolve_model
from medfaq.index.model_files import check_model_directory
from medfaq.index.onnx.export import ensure_export
from medfaq.index.onnx.graph import OnnxGraph

logger = logging.getLogger("medfaq.encoder")


class OnnxEncoder:
    """The :class:`index.encoder.Encoder` interface on ONNX Runtime (CPU): `name`, `dim`, `fingerprint`,
    `max_seq_length`, `encode`. `precision` ``int8`` runs the dynamically quantised graph (weights int8 per
    channel), used only where it agrees with the fp32 graph (index/onnx/check.py); its fingerprint is the source
    model's, since it encodes with the same weights."""

    device = "cpu"
    thread_safe = True  # ONNX Runtime's `InferenceSession.run` and `tokenizers`' encoding take concurrent calls

    def __init__(self, name: str | None = None, precision: str = "fp32", batch_size: int = 64) -> None:
        self.name = str(name or DEFAULT_ENCODER)
        self.batch_size = batch_size
        self.backend = "onnx" if precision == "fp32" else f"onnx-{precision}"
        location = resolve_model(self.name)
        check_model_directory(location, self.name)
        self.graph = OnnxGraph(ensure_export(location, precision=precision), precision, name=self.name)
        self.dim = self.graph.info.dim
        self.fingerprint = self.graph.info.fingerprint
        logger.info("encoder %s (dim %d) on ONNX Runtime, %s", self.name, self.dim, precision)

    @property
    def check(self) -> dict:
        """How this graph agreed with its source when it was checked (recorded in the manifest of an index it
        encodes): the fp32 graph's largest difference from PyTorch, or the int8 graph's probe-search check."""
        if self.graph.check_result is not None:
            return self.graph.check_result.to_dict()
        return {"backend": self.backend, **self.graph.info.checks.get("fp32", {})}

    @property
    def max_seq_length(self) -> int:
        return self.graph.info.max_seq_length

    def encode(self, texts: list[str], progress: bool = False) -> np.ndarray:
        """(len(texts), dim) float32, unit-norm rows, in batches of similar length; a tqdm bar when `progress`."""
        return encode_by_length(texts, self.dim, self.batch_size, self.graph.embed, progress)


def encode_by_length(
    texts: list[str], dim: int, batch_size: int, embed: Callable[[list[str]], np.ndarray], progress: bool = False
) -> np.ndarray:
    """(len(texts), dim) float32 unit-norm rows of `embed`'s vectors, which it makes for batches of `batch_size` texts
    of similar length (longest first: the least padding); a tqdm bar when `progress`. Both encoder runtimes use it."""
    vectors = np.zeros((len(texts), dim), dtype=np.float32)
    order = np.argsort([-len(text) for text in texts], kind="stable")
    starts = range(0, len(texts), batch_size)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc="encoding", unit="batch")
    for start in starts:
        rows = order[start : start + batch_size]
        vectors[rows] = embed([texts[row] for row in rows])
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.ascontiguousarray(vectors / np.maximum(norms, 1e-12), dtype=np.float32)
