"""An ONNX export of an encoder on disk and how to run it: its directory's layout and ``export.json``
(:class:`ExportInfo`), where the export of a model lives, and :class:`OnnxGraph`, one graph with its tokenizer run
on ONNX Runtime. Made by :mod:`medfaq.index.onnx_export`, used by :mod:`medfaq.index.onnx_encoder` and the
reranker."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from medfaq.common.runtime import MedfaqError, models_dir

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
