"""What a model directory says about itself without loading it (whether it is a bi-encoder, by the kind
common/model_kinds.py reads; its declared dimension), and the fingerprint of a loaded model's weights: shared by the
PyTorch encoder, the ONNX encoder and its exporter."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from medfaq.common.model_kinds import ENCODER_KINDS, check_model_kind
from medfaq.common.runtime import MedfaqError

FULL_HASH_PARAMETERS = 500_000_000  # above this many parameters the fingerprint hashes the configuration only
MODEL_MARKERS = ("modules.json", "config.json")  # a sentence-transformers or Hugging Face model directory has one


def model_fingerprint(model: Any) -> str:
    """sha256 of a SentenceTransformer's weights (every tensor, in order), or of its configuration when the model is
    huge: two encoders with the same fingerprint give the same vectors."""
    import torch

    digest = hashlib.sha256()
    state = model.state_dict()
    full = sum(tensor.numel() for tensor in state.values()) <= FULL_HASH_PARAMETERS
    for name, tensor in state.items():
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        if full:
            digest.update(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    if not full:
        for module in model:
            config = getattr(getattr(module, "auto_model", None), "config", None)
            digest.update(json.dumps(config.to_dict() if config else {}, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def check_model_directory(location: str, name: str) -> None:
    """A one-line error when `location` is a local directory that holds no sentence-transformers or HF model, or a
    model of another kind than a bi-encoder (a cross-encoder, a summarizer: common/model_kinds.py)."""
    path = Path(location)
    if path.is_dir() and not any((path / marker).is_file() for marker in MODEL_MARKERS):
        raise MedfaqError(
            f"{name!r} is not a sentence-transformers or Hugging Face model directory (it has no "
            f"{' or '.join(MODEL_MARKERS)}); pass 'minilm', a trained model directory, or a hub id"
        )
    check_model_kind(path, ENCODER_KINDS, repr(name))


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
                    elif isinstance(config.get("pooling_mode"), str):  # sentence-transformers 5: one mode, named
                        dimension = config.get("embedding_dimension")
            return dimension if isinstance(dimension, int) else None
        if (path / "config.json").is_file():
            hidden = json.loads((path / "config.json").read_text(encoding="utf-8")).get("hidden_size")
            return hidden if isinstance(hidden, int) else None
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return None
