"""Sentence encoders: offline model names, device and backend choice (PyTorch or ONNX Runtime), normalised float32
batches."""

from __future__ import annotations

import logging
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from medfaq.common.runtime import (
    CPU_BACKEND,
    DEFAULT_ENCODER,
    ENCODER_BACKENDS,
    MedfaqError,
    choose_device,
    resolve_model,
)
from medfaq.index.model_files import check_model_directory, model_fingerprint

if TYPE_CHECKING:
    from medfaq.index.onnx.encoder import OnnxEncoder

logger = logging.getLogger("medfaq.encoder")


class SentenceEncoder(Protocol):
    """What an index needs of an encoder, whatever runs it: :class:`Encoder` (PyTorch) or
    :class:`~index.onnx.encoder.OnnxEncoder` (ONNX Runtime)."""

    name: str
    dim: int
    device: str
    batch_size: int
    backend: str
    thread_safe: bool
    """Whether `encode` may run in several threads at once (no lock needed around it)."""

    @property
    def fingerprint(self) -> str: ...

    def encode(self, texts: list[str], progress: bool = False) -> np.ndarray: ...


class Encoder:
    """Encodes texts into L2-normalised float32 vectors with sentence-transformers (PyTorch).

    `name` is what the user passed (``"minilm"``, a directory, a hub id); it is recorded in the index manifest,
    so an index is only searched with the encoder that built it.
    """

    backend = "torch"
    thread_safe = False  # a fast tokenizer shared by threads can fail with "Already borrowed"

    def __init__(self, name: str | None = None, device: str | None = None, batch_size: int = 64) -> None:
        self.name = str(name or DEFAULT_ENCODER)
        location = resolve_model(self.name)  # a wrong name or path fails before the libraries load
        check_model_directory(location, self.name)
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        if not logger.isEnabledFor(logging.INFO):
            hf_logging.disable_progress_bar()  # the per-load "Loading weights" bar
        self.device = choose_device(device)
        self.batch_size = batch_size
        try:
            self.model = SentenceTransformer(location, device=self.device)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
            reason = " ".join(str(error).split())[:200]
            raise MedfaqError(f"cannot load encoder {self.name!r} ({type(error).__name__}: {reason})") from None
        dim = self.model.get_embedding_dimension()
        if not dim:
            raise MedfaqError(f"encoder {self.name!r} does not say the dimension of its embeddings")
        self.dim = int(dim)
        logger.info("encoder %s (dim %d) on %s", self.name, self.dim, self.device)

    @cached_property
    def fingerprint(self) -> str:
        """See :func:`model_fingerprint`."""
        return model_fingerprint(self.model)

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


def resolve_backend(backend: str = "auto", device: str | None = None) -> str:
    """The encoder backend `backend` (one of `ENCODER_BACKENDS`) means here: ``auto`` is PyTorch on a GPU (a
    `device` other than ``cpu``, or a visible CUDA GPU when no device is given) and `CPU_BACKEND` on the CPU."""
    if backend not in ENCODER_BACKENDS:
        raise MedfaqError(f"unknown encoder backend {backend!r}; choose one of {', '.join(ENCODER_BACKENDS)}")
    on_gpu = device != "cpu" if device else gpu_visible()
    if backend == "auto":
        return "torch" if on_gpu else CPU_BACKEND
    if backend != "torch" and device not in (None, "cpu"):
        raise MedfaqError(f"the ONNX encoder backends run on the CPU, not {device}; use --encoder-backend torch")
    return backend


def gpu_visible() -> bool:
    """Whether torch sees a CUDA GPU; torch is imported only where an NVIDIA device node exists."""
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        return False
    import torch

    return torch.cuda.is_available()


def load_encoder(
    name: str | None = None, backend: str = "auto", device: str | None = None, batch_size: int = 64
) -> Encoder | OnnxEncoder:
    """The encoder `name` on the backend :func:`resolve_backend` picks: :class:`Encoder` (PyTorch) or
    :class:`~index.onnx.encoder.OnnxEncoder` (exported on first use). Both give the same fingerprint."""
    chosen = resolve_backend(backend, device)
    if chosen == "torch":
        return Encoder(name, device=device, batch_size=batch_size)
    from medfaq.index.onnx.encoder import OnnxEncoder

    return OnnxEncoder(name, precision="int8" if chosen == "onnx-int8" else "fp32", batch_size=batch_size)
