"""An ONNX export of an encoder on disk and how to run it: its directory's layout and ``export.json``
(:class:`ExportInfo`), where the export of a model lives, and :class:`OnnxGraph`, one graph with its tokenizer run
on ONNX Runtime. Made by :mod:`medfaq.index.onnx.export`, used by :mod:`medfaq.index.onnx.encoder` and the
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
from medfaq.index.onnx.check import (
    GraphCheck,
    check_encoder,
    check_pair_scores,
    cpu_signature,
    probe_pairs,
    probe_texts,
    require_agreement,
)

EXPORT_DIR = "medfaq-onnx"
EXPORT_INFO = "export.json"
EXPORT_VERSION = 3  # raised when the export's layout changes: older exports are made again (3: checked int8)
TOKENIZER_FILE = "tokenizer.json"
GRAPHS = {"fp32": "model.onnx", "int8": "model_int8.onnx"}
PROBE_OUTPUTS = "probe_fp32.npy"
"""The fp32 graph's outputs on index/onnx/check.py's probes, which a derived graph is checked against."""
INSTALLED = {"site-packages", "dist-packages"}  # a model inside an installed package is never written to


@dataclass
class ExportInfo:
    """``export.json``: what the export was made from and what its graphs take and give (`dim`: the width of the
    output; `activation`: for a cross-encoder, what its scores apply to that logit, ``sigmoid`` or ``identity``;
    `checks`: per precision, how its graph agreed with its source when it was made: the fp32 graph's largest
    difference from PyTorch, the int8 graph's :class:`~index.onnx.check.GraphCheck`)."""

    fingerprint: str
    dim: int
    max_seq_length: int
    inputs: list[str]
    pad_id: int
    pad_token: str
    source: dict[str, list[int]] = field(default_factory=dict)
    optimized: bool = False
    activation: str = ""
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: int = EXPORT_VERSION

    def save(self, directory: Path) -> None:
        """Write ``export.json`` in `directory` at once: a process reading it meanwhile reads the old one or this."""
        tmp = directory / f".{EXPORT_INFO}.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")
        tmp.replace(directory / EXPORT_INFO)

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


_prepacking = {"enabled": True}


def set_weight_prepacking(enabled: bool) -> None:
    """Whether graphs loaded from now on in this process pre-pack their weights for the CPU's matrix kernels (the
    default). Pre-packing costs set-up time (about 1 s for MPNet's 435 MB graph, 0.1 s for MiniLM's) and then
    roughly halves the time of every call, with the same outputs; a process that answers one question and exits
    (``medfaq search QUESTION``) turns it off."""
    _prepacking["enabled"] = enabled


def session_options() -> Any:
    """ONNX Runtime options: all graph optimisations, weights pre-packed unless :func:`set_weight_prepacking`
    turned that off; `OMP_NUM_THREADS`, when set, caps the threads as it does for torch."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if not _prepacking["enabled"]:
        options.add_session_config_entry("session.disable_prepacking", "1")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        options.intra_op_num_threads = int(threads)
    return options


class OnnxGraph:
    """One exported graph with its tokenizer: texts -> the model's sentence embeddings (not re-normalised).

    A derived graph (int8) is used only where its check passed: on the CPU it was checked on, by the check recorded
    when it was made; on another CPU, by the same probe search run here against the fp32 graph's stored outputs.
    `verify` False skips that (the exporter, checking it). `name` names the model in errors."""

    def __init__(self, directory: Path, precision: str = "fp32", verify: bool = True, name: str = "") -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        if precision not in GRAPHS:
            raise MedfaqError(f"unknown ONNX precision {precision!r}; choose one of {', '.join(GRAPHS)}")
        info = ExportInfo.read(directory)
        if info is None:
            raise MedfaqError(f"{directory} holds no ONNX export (no readable {EXPORT_INFO})")
        self.info = info
        self.precision = precision
        self.name = name or str(directory)
        recorded = info.checks.get(precision) if precision != "fp32" else None
        self.check_result = GraphCheck.from_dict(recorded) if recorded else None
        if verify and precision != "fp32":
            self._require(self.check_result)
        self.tokenizer = Tokenizer.from_file(str(directory / TOKENIZER_FILE))
        self.tokenizer.enable_truncation(info.max_seq_length)
        self.tokenizer.enable_padding(pad_id=info.pad_id, pad_token=info.pad_token)
        self.session = ort.InferenceSession(
            str(directory / GRAPHS[precision]), session_options(), providers=["CPUExecutionProvider"]
        )
        if verify and self.check_result is not None and self.check_result.cpu != cpu_signature():
            source = np.load(directory / PROBE_OUTPUTS, allow_pickle=False)
            self.check_result = self.check(source, self.check_result.setting)
            self._require(self.check_result)

    def _require(self, check: GraphCheck | None) -> None:
        """One-line refusal of this derived graph unless `check` (None: never checked) passed."""
        works = "rerank without --quantize" if self.info.activation else "use --encoder-backend onnx (fp32) or torch"
        what = f"the {self.precision} ONNX graph of {self.name}"
        if check is None:
            raise MedfaqError(f"{what} was never checked against its fp32 source; it is not used: {works}")
        require_agreement(check, what, works)

    def probe_outputs(self) -> np.ndarray:
        """This graph's outputs on the probe search: unit vectors of the probe texts (an encoder) or the logits of
        the probe pairs (a cross-encoder)."""
        if self.info.activation:
            return self.embed(probe_pairs()).reshape(-1)
        vectors = self.embed(probe_texts())
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)

    def check(self, source: np.ndarray, setting: str = "") -> GraphCheck:
        """This graph's probe search against the fp32 graph's outputs `source` on this CPU."""
        backend = f"onnx-{self.precision}"
        if self.info.activation:
            return check_pair_scores(backend, source, self.probe_outputs(), setting)
        return check_encoder(backend, source, self.probe_outputs(), setting)

    def embed(self, texts: list[str] | list[tuple[str, str]]) -> np.ndarray:
        """(len(texts), dim) float32 embeddings of one batch (of texts, or of pairs for a cross-encoder)."""
        encodings = self.tokenizer.encode_batch(list(texts))
        columns = {
            "input_ids": [e.ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
        }
        feed = {name: np.asarray(columns[name], dtype=np.int64) for name in self.info.inputs}
        return np.asarray(self.session.run(None, feed)[0], dtype=np.float32)
