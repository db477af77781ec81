"""The cross-encoder: MiniLM (or any BERT-like model) with a one-logit head over a text pair (trained by
:mod:`retriever.reranker.training`); :class:`CrossEncoderReranker` scores (query, FAQ) pairs for the pipeline.

The head (``head``): ``cosine`` = the cosine of the mean token vectors of the two texts' segments, scaled and shifted
(all-MiniLM-L6-v2 was trained to make exactly these means similar for paraphrases, so training starts near the
bi-encoder instead of at chance); ``mean`` = mean pooling of all token vectors then a linear layer; ``cls`` = the [CLS]
vector then a linear layer; ``pooler`` = the stock ``*ForSequenceClassification`` head over the checkpoint's BERT
pooler (untrained in mean-pooling checkpoints). A pair longer than the model's max length loses tokens from the end
of its first text (the query); the second text (the FAQ) is kept whole while it fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sentence_transformers.base.modules import Module

from medfaq.common.model_kinds import has_classifier_head
from medfaq.common.runtime import (
    MedfaqError,
    autocast,
    choose_device,
    quantize_linear,
    resolve_model,
    resolve_precision,
)
from medfaq.retriever.biencoder.scorer import BiEncoderScorer
from medfaq.retriever.reranker.base import PRIOR_DIR, PairReranker, cut_first, decision_boundary, trained_crossencoder
from medfaq.retriever.training.config import CONFIG_FILE, HEADS, EncoderTrainConfig

HEAD_CLASS_NAMES = (
    f"{__name__}.SegmentCosine",
    "medfaq.retriever.crossencoder.SegmentCosine",
    "retriever.crossencoder.SegmentCosine",
)
"""What a saved model's ``modules.json`` calls :class:`SegmentCosine`: its class path, the one it had before the
cross-encoder got its own package, or the one before the packages were installed as one ``medfaq`` namespace."""


class SegmentCosine(Module):
    """Score = scale * (cosine(mean token vector of text 1, mean token vector of text 2) - shift); the segments come
    from ``token_type_ids``, or for encoders without them (MPNet, RoBERTa) from the first `separator_id` on: text 2
    is every later token but the separators."""

    config_keys = ["scale", "shift", "separator_id"]

    def __init__(self, scale: float = 10.0, shift: float = 0.5, separator_id: int | None = None) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(float(scale)))
        self.shift = torch.nn.Parameter(torch.tensor(float(shift)))
        self.separator_id = separator_id

    def get_config_dict(self) -> dict[str, float | int | None]:
        return {
            "scale": self.scale.detach().item(),
            "shift": self.shift.detach().item(),
            "separator_id": self.separator_id,
        }

    def forward(self, features: dict, **kwargs) -> dict:
        tokens, mask = features["token_embeddings"].float(), features["attention_mask"].unsqueeze(-1).float()
        if "token_type_ids" in features:
            second = features["token_type_ids"].unsqueeze(-1).float()
        elif self.separator_id is not None:
            separators = features["input_ids"] == self.separator_id
            second = ((separators.cumsum(1) >= 1) & ~separators).unsqueeze(-1).float()
        else:
            raise MedfaqError("the cosine head needs token type ids or the encoder's separator token id")
        means = [(tokens * m).sum(1) / m.sum(1).clamp(min=1.0) for m in (mask * (1 - second), mask * second)]
        cosine = torch.nn.functional.cosine_similarity(*means, dim=-1)
        features["scores"] = (self.scale * (cosine - self.shift)).unsqueeze(1)
        return features

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        self.save_config(output_path)
        self.save_torch_weights(output_path, safe_serialization=safe_serialization)

    @classmethod
    def load(cls, model_name_or_path: str, **kwargs) -> SegmentCosine:
        hub = {key: kwargs[key] for key in ("subfolder", "token", "cache_folder", "revision") if key in kwargs}
        model = cls(**cls.load_config(model_name_or_path=model_name_or_path, **hub))
        return cls.load_torch_weights(model_name_or_path=model_name_or_path, model=model, **hub)


def load_crossencoder(model: str | Path, device: str | None = None, max_length: int | None = None, head: str = "mean"):
    """A trained cross-encoder, or a plain encoder (e.g. ``minilm``) with a new one-logit `head` (randomly
    initialised for mean/cls/pooler: seed first for a repeatable head)."""
    from sentence_transformers import CrossEncoder
    from sentence_transformers.base.modules import Dense, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    if head not in HEADS:
        raise MedfaqError(f"unknown head {head!r}; choose one of {', '.join(HEADS)}")
    path = resolve_model(model)
    device = choose_device(device)
    if has_classifier_head(path):
        # our own head class is resolved in memory, not imported by the name stored in the model directory
        heads = dict.fromkeys(HEAD_CLASS_NAMES, SegmentCosine)
        return CrossEncoder._load_with_module_classes(path, heads, device=device, max_length=max_length)
    processor = {"model_max_length": max_length} if max_length else None
    if head == "pooler":
        transformer = Transformer(
            path,
            transformer_task="sequence-classification",
            config_kwargs={"num_labels": 1},
            processor_kwargs=processor,
        )
        return CrossEncoder(modules=[transformer], device=device)
    transformer = Transformer(path, transformer_task="feature-extraction", processor_kwargs=processor)
    if head == "cosine":
        transformer.model.config.num_labels = 1  # what CrossEncoder reads as its number of outputs
        tokenizer = transformer.tokenizer
        separator = None if "token_type_ids" in tokenizer.model_input_names else tokenizer.sep_token_id
        return CrossEncoder(modules=[transformer, SegmentCosine(separator_id=separator)], device=device)
    dim = transformer.get_embedding_dimension()
    pooling = Pooling(dim, pooling_mode=head)
    score = Dense(dim, 1, activation_function=None, module_output_name="scores")
    return CrossEncoder(modules=[transformer, pooling, score], device=device)


def truncate_first(tokenizer, pairs: Sequence[tuple[str, str]], max_length: int) -> list[tuple[str, str]]:
    """Cut each pair's first text (at a token boundary of the original string) so the pair fits `max_length`
    tokens with its second text whole; a second text too long to fit alone is left to the tokenizer's truncation."""
    quiet = {"add_special_tokens": False, "verbose": False}  # lengths over the model's maximum are the point here
    firsts = tokenizer([a for a, _ in pairs], return_offsets_mapping=True, **quiet)["offset_mapping"]
    seconds = [len(ids) for ids in tokenizer([b for _, b in pairs], **quiet)["input_ids"]]
    return cut_first(pairs, firsts, seconds, max_length - tokenizer.num_special_tokens_to_add(pair=True))


class CrossEncoderReranker(PairReranker):
    """A sentence-transformers cross-encoder on PyTorch as a :class:`~retriever.reranker.base.PairReranker`; `precision`
    of its matrix products (fp32, bf16 or auto, see `common.runtime.resolve_precision`)."""

    def __init__(
        self,
        model,
        batch_size: int = 32,
        name: str = "",
        symmetric: bool = False,
        prior: BiEncoderScorer | None = None,
        prior_scale: float = 0.0,
        precision: str = "fp32",
        decision_boundary: float = 0.5,
    ) -> None:
        super().__init__(name, symmetric, prior, prior_scale, decision_boundary)
        self.model = model
        self.precision = resolve_precision(precision, str(model.device))
        self.batch_size = batch_size

    @classmethod
    def load(
        cls,
        model: str | Path,
        device: str | None = None,
        quantize: bool = False,
        batch_size: int = 32,
        max_length: int | None = None,
        precision: str = "fp32",
    ) -> CrossEncoderReranker:
        """Load a trained cross-encoder (any name `resolve_model` accepts); `quantize` = int8 dynamic (CPU only);
        `max_length`: tokens per pair (None = the trained length); `precision`: of its matrix products (fp32, bf16
        or auto, see `common.runtime.resolve_precision`)."""
        path = trained_crossencoder(model)
        encoder = load_crossencoder(path, device="cpu" if quantize else device, max_length=max_length)
        if quantize:
            quantize_checked(encoder, str(model))
        config = EncoderTrainConfig.load(path) if (path / CONFIG_FILE).is_file() else EncoderTrainConfig()
        prior = BiEncoderScorer.load(path / PRIOR_DIR, device, quantize) if config.prior_scale else None
        boundary = decision_boundary(config)
        return cls(encoder, batch_size, str(model), config.symmetric, prior, config.prior_scale, precision, boundary)

    def _predict(self, pairs: Sequence[tuple[str, str]], progress: bool) -> np.ndarray:
        fitted = truncate_first(self.model.tokenizer, pairs, self.model.max_seq_length)
        logits_only = {"activation_fn": torch.nn.Identity()} if self.prior is not None else {}
        with autocast(self.precision, str(self.model.device)):
            scores = self.model.predict(fitted, batch_size=self.batch_size, show_progress_bar=progress, **logits_only)
        return np.asarray(scores, dtype=np.float32).reshape(-1)


def quantize_checked(encoder: Any, name: str) -> None:
    """Convert the cross-encoder `encoder`'s linear layers to int8 (PyTorch dynamic quantisation), refused with one
    line where its logits of the probe search disagree with the fp32 model's (index/onnx/check.py)."""
    from medfaq.index.onnx.check import check_pair_scores, probe_pairs, require_agreement

    def probe_logits() -> np.ndarray:
        logits = encoder.predict(probe_pairs(), activation_fn=torch.nn.Identity(), show_progress_bar=False)
        return np.asarray(logits, dtype=np.float32).reshape(-1)

    source = probe_logits()
    quantize_linear(encoder)
    check = check_pair_scores("torch-int8", source, probe_logits())
    require_agreement(check, f"the int8 (PyTorch dynamic) reranker {name}", "rerank without --quantize")
