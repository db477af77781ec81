"""A thin sentence encoder over SentenceTransformer: offline model names, device choice, normalised float32 batches."""

from __future__ import annotations

import hashlib
import json
import logging
from functools import cached_property
from pathlib import Path

import numpy as np

from index.runtime import DEFAULT_ENCODER, MedfaqError, choose_device, resolve_model

logger = logging.getLogger("medfaq.encoder")

FULL_HASH_PARAMETERS = 500_000_000  # above this many parameters the fingerprint hashes the configuration only
MODEL_MARKERS = ("modules.json", "config.json")  # a sentence-transformers or Hugging Face model directory has one


class Encoder:
    """Encodes texts into L2-normalised float32 vectors.

    `name` is what the user passed (``"minilm"``, a directory, a hub id); it is recorded in the index manifest,
    so an index is only searched with the encoder that built it.
    """

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
        """sha256 of the model's weights (every tensor, in order), or of its configuration when the model is huge:
        two encoders with the same fingerprint give the same vectors."""
        import torch

        digest = hashlib.sha256()
        state = self.model.state_dict()
        full = sum(tensor.numel() for tensor in state.values()) <= FULL_HASH_PARAMETERS
        for name, tensor in state.items():
            digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
            if full:
                digest.update(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        if not full:
            for module in self.model:
                config = getattr(getattr(module, "auto_model", None), "config", None)
                digest.update(json.dumps(config.to_dict() if config else {}, sort_keys=True, default=str).encode())
        return digest.hexdigest()

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


def check_model_directory(location: str, name: str) -> None:
    """A one-line error when `location` is a local directory that holds no sentence-transformers or HF model."""
    path = Path(location)
    if path.is_dir() and not any((path / marker).is_file() for marker in MODEL_MARKERS):
        raise MedfaqError(
            f"{name!r} is not a sentence-transformers or Hugging Face model directory (it has no "
            f"{' or '.join(MODEL_MARKERS)}); pass 'minilm', a trained model directory, or a hub id"
        )


def declared_dimension(location: str) -> int | None:
    """The embedding dimension a local model directory declares in its files (the last Dense layer's output, else
    the pooling's single mode, else a plain Hugging Face model's hidden size), read without loading the model;
    None when it cannot be told that way (a hub id, an unusual module chain)."""
    path = Path(location)
    try:
        if (path / "modules.json").is_file():
            dimension = None
            for module in json.loads((path / "modules.json").read_text(encoding="utf-8")):
                config_file = path / module.get("path", "") / "config.json"
                kind = str(module.get("type", ""))
                if kind.endswith(("Dense", "Pooling")) and config_file.is_file():
                    config = json.loads(config_file.read_text(encoding="utf-8"))
                    if kind.endswith("Dense"):
                        dimension = config.get("out_features")
                    elif sum(bool(value) for key, value in config.items() if key.startswith("pooling_mode_")) == 1:
                        dimension = config.get("word_embedding_dimension")
            return dimension if isinstance(dimension, int) else None
        if (path / "config.json").is_file():
            hidden = json.loads((path / "config.json").read_text(encoding="utf-8")).get("hidden_size")
            return hidden if isinstance(hidden, int) else None
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return None
