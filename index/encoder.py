"""Sentence encoders: offline model names, device and backend choice (PyTorch or ONNX Runtime), normalised float32
batches."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
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
    resolve_precision,
)
from medfaq.index.model_files import check_model_directory, model_fingerprint

if TYPE_CHECKING:
    from medfaq.index.onnx.encoder import OnnxEncoder

logger = logging.getLogger("medfaq.encoder")
TORCH_BACKENDS = {"fp32": "torch", "bf16": "torch-bf16"}
"""The PyTorch encoder backend of each weight precision."""


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
    so an index is only searched with the encoder that built it. `precision` ``bf16`` casts the weights to bf16
    (inference only) after the cast model's probe search agreed with the fp32 model's (index/onnx/check.py); the
    fingerprint stays the fp32 weights', as with an int8 graph.
    """

    thread_safe = True  # texts are tokenized under a lock (a shared fast tokenizer fails with "Already borrowed")

    def __init__(
        self, name: str | None = None, device: str | None = None, batch_size: int = 64, precision: str = "fp32"
    ) -> None:
        self.name = str(name or DEFAULT_ENCODER)
        location = resolve_model(self.name)  # a wrong name or path fails before the libraries load
        check_model_directory(location, self.name)
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        if not logger.isEnabledFor(logging.INFO):
            hf_logging.disable_progress_bar()  # the per-load "Loading weights" bar
        self.device = choose_device(device)
        self.batch_size = batch_size
        self.backend = TORCH_BACKENDS[precision]
        self._tokenizing = threading.Lock()
        try:
            self.model = SentenceTransformer(location, device=self.device)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
            reason = " ".join(str(error).split())[:200]
            raise MedfaqError(f"cannot load encoder {self.name!r} ({type(error).__name__}: {reason})") from None
        dim = self.model.get_embedding_dimension()
        if not dim:
            raise MedfaqError(f"encoder {self.name!r} does not say the dimension of its embeddings")
        self.dim = int(dim)
        self.check: dict = {}
        if precision == "bf16":
            self._cast_to_bf16()
        logger.info("encoder %s (dim %d) on %s, %s", self.name, self.dim, self.device, precision)

    @cached_property
    def fingerprint(self) -> str:
        """See :func:`model_fingerprint`."""
        return model_fingerprint(self.model)

    @property
    def max_seq_length(self) -> int:
        return int(self.model.max_seq_length)

    def encode(self, texts: list[str], progress: bool = False) -> np.ndarray:
        """(len(texts), dim) float32, unit-norm rows, in batches of similar length; a tqdm bar when `progress`."""
        from medfaq.index.onnx.encoder import encode_by_length

        return encode_by_length(texts, self.dim, self.batch_size, self._embed, progress)

    def _embed(self, texts: list[str]) -> np.ndarray:
        import torch
        from sentence_transformers.util import batch_to_device

        with self._tokenizing:
            features = self.model.preprocess(texts)
        with torch.inference_mode():
            output = self.model(batch_to_device(features, self.model.device))["sentence_embedding"]
        return output.float().cpu().numpy()

    def _cast_to_bf16(self) -> None:
        """Cast the weights to bf16, refused with one line where the probe search disagrees with fp32's."""
        import torch

        from medfaq.index.onnx.check import check_encoder, probe_texts, require_agreement

        self.fingerprint  # noqa: B018 -- of the fp32 weights, before the cast
        source = self.encode(probe_texts())
        self.model.to(torch.bfloat16)
        result = check_encoder(self.backend, source, self.encode(probe_texts()), "bf16 weights")
        require_agreement(result, f"the bf16 encoder {self.name}", "use --encoder-backend onnx")
        self.check = result.to_dict()


_process = {"one_question": False}


def answer_one_question() -> None:
    """Mark this process as one that answers a single question and exits (``medfaq search QUESTION``): `auto` then
    keeps the encoder on ONNX Runtime, which starts without importing torch, and graphs skip pre-packing their
    weights, whose set-up would cost more than the faster calls save."""
    from medfaq.index.onnx.graph import set_weight_prepacking

    _process["one_question"] = True
    set_weight_prepacking(False)


def resolve_backend(backend: str = "auto", device: str | None = None) -> str:
    """The encoder backend `backend` (one of `ENCODER_BACKENDS`) means here. ``auto`` is PyTorch on a GPU (a
    `device` other than ``cpu``, or a visible CUDA GPU when no device is given); on the CPU it is ``torch-bf16``
    where this CPU measures bf16 matrix products fast (:func:`~common.runtime.resolve_precision`: AMX and AVX-512
    BF16 units), else `CPU_BACKEND`, which a one-question process (:func:`answer_one_question`) always takes."""
    if backend not in ENCODER_BACKENDS:
        raise MedfaqError(f"unknown encoder backend {backend!r}; choose one of {', '.join(ENCODER_BACKENDS)}")
    on_gpu = device != "cpu" if device else gpu_visible()
    if backend == "auto":
        if on_gpu:
            return "torch"
        if _process["one_question"] or resolve_precision("auto", "cpu") != "bf16":
            return CPU_BACKEND
        return TORCH_BACKENDS["bf16"]
    if backend not in TORCH_BACKENDS.values() and device not in (None, "cpu"):
        raise MedfaqError(f"the ONNX encoder backends run on the CPU, not {device}; use --encoder-backend torch")
    return backend


def export_for_searches(name: str, announce: Callable[[str], None]) -> None:
    """Export encoder `name` to ONNX Runtime now unless this machine's searches run it on a GPU: on the CPU a
    one-question ``medfaq search`` always runs it there, and would otherwise export it first (20 to 70 s).
    ``medfaq index build`` calls this; `announce` gets the progress line. A model that cannot be exported is the
    exporter's one-line error."""
    if gpu_visible():
        return
    from medfaq.index.onnx.export import ensure_export

    ensure_export(resolve_model(name), announce=announce)


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
    :class:`~index.onnx.encoder.OnnxEncoder` (exported on first use). All give the same fingerprint. Where `auto`
    picked bf16 weights and they disagree with fp32 on the probe search, it runs on `CPU_BACKEND` instead."""
    check_model_directory(resolve_model(str(name or DEFAULT_ENCODER)), str(name))  # before torch may be imported
    chosen = resolve_backend(backend, device)
    if chosen in TORCH_BACKENDS.values():
        precision = "bf16" if chosen == TORCH_BACKENDS["bf16"] else "fp32"
        try:
            return Encoder(name, device=device, batch_size=batch_size, precision=precision)
        except MedfaqError as error:
            if backend != "auto" or precision != "bf16":
                raise
            logger.info("encoder %s on %s: %s", name, CPU_BACKEND, error)  # the bf16 weights disagreed with fp32
            chosen = CPU_BACKEND
    from medfaq.index.onnx.encoder import OnnxEncoder

    return OnnxEncoder(name, precision="int8" if chosen == "onnx-int8" else "fp32", batch_size=batch_size)
