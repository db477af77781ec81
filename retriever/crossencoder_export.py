"""Exports a trained cross-encoder for :mod:`retriever.onnx_reranker` (needs torch; runs once per model).

The whole module chain (the transformer and its head, SegmentCosine included) becomes one ONNX graph from token
ids to the logit, fused by ONNX Runtime's transformer optimizer like the bi-encoder's (index/onnx_export.py), and
quantised to int8 for ``--quantize``. Before the export is kept, its logits of probe pairs (cut as the reranker
cuts them) are compared with PyTorch's; a fused graph that drifts is replaced by the plain one.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from medfaq.common.runtime import MedfaqError
from medfaq.index.onnx_export import finish_export, trace_export
from medfaq.index.onnx_graph import ExportInfo

logger = logging.getLogger("medfaq.crossencoder")

TOLERANCE = 1e-4  # largest difference from PyTorch's logits an fp32 export may show
PROBES = [
    ("What are the symptoms of type 2 diabetes?", "What are the signs of diabetes?"),
    ("  CAN I take IBUPROFEN with   amoxicillin?? ", "Is it safe to combine painkillers and antibiotics?"),
    ("", "What is shingles?"),
    ("什么是糖尿病 😀", "What is diabetes?"),
    ("my doctor said " * 60 + "is shingles contagious?", "Can I catch shingles from someone?"),  # the query cut
    ("Is shingles contagious?", "shingles " * 400),  # an FAQ longer than the model reads
]
"""Pairs the export is checked on: ordinary, odd spacing and case, empty, non-Latin, too long on either side."""
ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "identity"}


def export_crossencoder(location: str, out: Path) -> None:
    """Export the cross-encoder saved at `location` into the new directory `out`."""
    import torch

    from medfaq.retriever.crossencoder import load_crossencoder

    model = load_crossencoder(location, device="cpu")
    activation = ACTIVATIONS.get(type(model.activation_fn).__name__)
    tokenizer = model.tokenizer
    if activation is None or getattr(tokenizer, "backend_tokenizer", None) is None:
        raise MedfaqError(
            f"reranker {location} has no fast (Rust) tokenizer or an activation other than sigmoid; "
            "rerank with --encoder-backend torch"
        )
    pairs = _fitted_probes(model)
    features = model.preprocess(pairs[:2])
    raw, info = trace_export(model, tokenizer, features, location, out, 1, output="scores", activation=activation)
    expected = model.predict(pairs, activation_fn=torch.nn.Identity(), convert_to_numpy=True).reshape(-1)
    failure = f"the ONNX export of reranker {location} differs from PyTorch by {{drift:.2g}}"
    config = model[0].model.config
    drift = finish_export(raw, info, config, lambda: _drift(out, info, expected), failure, TOLERANCE, location)
    logger.info("exported reranker %s to ONNX in %s (fp32 logits within %.1g of PyTorch)", location, out, drift)


def _fitted_probes(model) -> list[tuple[str, str]]:
    from medfaq.retriever.crossencoder import truncate_first

    return truncate_first(model.tokenizer, PROBES, model.max_seq_length)


def _drift(directory: Path, info: ExportInfo, expected: np.ndarray) -> float:
    """Largest absolute difference between the fp32 graph's logits of the probes and `expected`."""
    from medfaq.retriever.onnx_pair_model import OnnxPairModel

    info.save(directory)
    logits = OnnxPairModel(directory, "fp32").logits(PROBES)
    return float(np.abs(logits - expected).max())
