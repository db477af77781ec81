"""The bi-encoder on ONNX Runtime: a sentence-transformers model exported once (index/onnx_export.py) and run with
`onnxruntime` + `tokenizers` alone, so encoding imports neither torch, transformers nor sentence-transformers.

The export holds the whole module chain (Transformer, Pooling, any Dense, Normalize) as one graph, so it gives the
vectors sentence-transformers gives; ``export.json`` beside it records what torch would need to tell: the weights'
fingerprint (:func:`index.encoder.model_fingerprint`), the dimension, the tokens read, and the size and time of
every file of the source model, so a retrained model is exported again.

Where the export lives: ``EXPORT_DIR`` inside a writable model directory (a trained model), else a cache under
``$MEDFAQ_HOME/models/onnx`` (the MiniLM shipped in site-packages, hub ids).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from medfaq.common.runtime import DEFAULT_ENCODER, MedfaqError, make_once, models_dir, resolve_model

logger = logging.getLogger("medfaq.encoder")

EXPORT_DIR = "medfaq-onnx"
EXPORT_INFO = "export.json"
EXPORT_VERSION = 2  # raised when the export's layout changes: older exports are made again
TOKENIZER_FILE = "tokenizer.json"
GRAPHS = {"fp32": "model.onnx", "int8": "model_int8.onnx"}
INSTALLED = {"site-packages", "dist-packages"}  # a model inside an installed package is never written to


@dataclass
class ExportInfo:
    """``export.json``: what the export was made from and what its graphs take and give (`dim`: the width of the
    output; `activation`: for a cross-encoder, what its scores apply to that logit, ``sigmoid`` or ``identity``)."""

    fingerprint: str
    dim: int
    max_seq_length: int
    inputs: list[str]
    pad_id: int
    pad_token: str
    source: dict[str, list[int]] = field(default_factory=dict)
    optimized: bool = False
    activation: str = ""
    version: int = EXPORT_VERSION

    def save(self, directory: Path) -> None:
        (directory / EXPORT_INFO).write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, directory: Path) -> ExportInfo | None:
        try:
            data = json.loads((directory / EXPORT_INFO).read_text(encoding="utf-8"))
            return cls(**data)
        except (OSError, ValueError, TypeError):
            return None


def export_location(location: str) -> Path:
    """Where the export of the model at `location` (a directory or a hub id) lives."""
    path = Path(location)
    if path.is_dir() and os.access(path, os.W_OK) and not INSTALLED & set(path.resolve().parts):
        return path / EXPORT_DIR
    key = hashlib.sha256(location.encode()).hexdigest()[:12]
    return models_dir() / "onnx" / f"{path.name or 'model'}-{key}"


def source_signature(location: str) -> dict[str, list[int]]:
    """(size, mtime in ns) of every file of the model directory `location` but exports (its own, and those of
    models inside it, such as a reranker's prior) and dotfiles; empty for a hub id."""
    root = Path(location)
    if not root.is_dir():
        return {}
    signature = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        exported = any(part.startswith(EXPORT_DIR) for part in relative.parts)  # an export or its lock
        if exported or relative.parts[0].startswith(".") or not path.is_file():
            continue
        stat = path.stat()
        signature[relative.as_posix()] = [stat.st_size, stat.st_mtime_ns]
    return signature


def ensure_export(location: str, export: Callable[[str, Path], None] | None = None) -> Path:
    """The directory of an up-to-date export of the model at `location`, made (with torch, once) by
    ``export(location, directory)`` (default: :func:`index.onnx_export.export_encoder`) when missing or older than
    the model's files."""
    directory = export_location(location)
    info = ExportInfo.read(directory)
    if info is not None and (info.version != EXPORT_VERSION or info.source != source_signature(location)):
        logger.info("the model at %s changed since its ONNX export; exporting it again", location)
        (directory / EXPORT_INFO).unlink(missing_ok=True)
        info = None
    if info is None:
        if export is None:
            from medfaq.index.onnx_export import export_encoder as export
        make_once(directory, EXPORT_INFO, lambda out: export(location, out))
    return directory


def session_options() -> Any:
    """ONNX Runtime options: all graph optimisations; `OMP_NUM_THREADS`, when set, caps the threads as it does
    for torch."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        options.intra_op_num_threads = int(threads)
    return options


class OnnxGraph:
    """One exported graph with its tokenizer: texts -> the model's sentence embeddings (not re-normalised)."""

    def __init__(self, directory: Path, precision: str = "fp32") -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        if precision not in GRAPHS:
            raise MedfaqError(f"unknown ONNX precision {precision!r}; choose one of {', '.join(GRAPHS)}")
        info = ExportInfo.read(directory)
        if info is None:
            raise MedfaqError(f"{directory} holds no ONNX export (no readable {EXPORT_INFO})")
        self.info = info
        self.tokenizer = Tokenizer.from_file(str(directory / TOKENIZER_FILE))
        self.tokenizer.enable_truncation(info.max_seq_length)
        self.tokenizer.enable_padding(pad_id=info.pad_id, pad_token=info.pad_token)
        self.session = ort.InferenceSession(
            str(directory / GRAPHS[precision]), session_options(), providers=["CPUExecutionProvider"]
        )

    def embed(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) float32 embeddings of one batch."""
        encodings = self.tokenizer.encode_batch(list(texts))
        columns = {
            "input_ids": [e.ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
        }
        feed = {name: np.asarray(columns[name], dtype=np.int64) for name in self.info.inputs}
        return np.asarray(self.session.run(None, feed)[0], dtype=np.float32)


class OnnxEncoder:
    """The :class:`index.encoder.Encoder` interface on ONNX Runtime (CPU): `name`, `dim`, `fingerprint`,
    `max_seq_length`, `encode`. `precision` ``int8`` runs the dynamically quantised graph (weights int8 per
    channel); its fingerprint is the source model's, since it encodes with the same weights."""

    device = "cpu"
    thread_safe = True  # ONNX Runtime's `InferenceSession.run` and `tokenizers`' encoding take concurrent calls

    def __init__(self, name: str | None = None, precision: str = "fp32", batch_size: int = 64) -> None:
        from medfaq.index.encoder import check_model_directory

        self.name = str(name or DEFAULT_ENCODER)
        self.batch_size = batch_size
        self.backend = "onnx" if precision == "fp32" else f"onnx-{precision}"
        location = resolve_model(self.name)
        check_model_directory(location, self.name)
        self.graph = OnnxGraph(ensure_export(location), precision)
        self.dim = self.graph.info.dim
        self.fingerprint = self.graph.info.fingerprint
        logger.info("encoder %s (dim %d) on ONNX Runtime, %s", self.name, self.dim, precision)

    @property
    def max_seq_length(self) -> int:
        return self.graph.info.max_seq_length

    def encode(self, texts: list[str], progress: bool = False) -> np.ndarray:
        """(len(texts), dim) float32, unit-norm rows, in batches of similar length; a tqdm bar when `progress`."""
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = np.argsort([-len(text) for text in texts], kind="stable")
        starts = range(0, len(texts), self.batch_size)
        if progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="encoding", unit="batch")
        for start in starts:
            rows = order[start : start + self.batch_size]
            vectors[rows] = self.graph.embed([texts[row] for row in rows])
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return np.ascontiguousarray(vectors / np.maximum(norms, 1e-12), dtype=np.float32)
