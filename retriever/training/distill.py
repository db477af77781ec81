"""A fast student fitted to a better teacher (sentence-transformers' model distillation recipe, Reimers & Gurevych,
EMNLP 2020): the mean squared error between the student's sentence vectors and the teacher's
(``sentence_transformers.losses.MSELoss``), over the question texts of :mod:`retriever.training.distill_data`.

Where the teacher's vectors are wider than the student's (all-mpnet-base-v2's 768 against MiniLM's 384), the student
gets a Dense projection (linear, no activation) after its pooling, so its vectors live in the teacher's space. The
projection costs next to nothing in encoding time (one 384 x 768 product per text) but doubles what an index stores
and scans: 3 KB instead of 1.5 KB of float32 per FAQ, about 146 MB instead of 73 MB of vectors for MedQuAD's 47,441
questions.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from medfaq.common.runtime import seed_everything
from medfaq.index.model_files import model_fingerprint
from medfaq.retriever.biencoder import load_biencoder
from medfaq.retriever.training.loop import train_loop
from medfaq.retriever.training.student_config import StudentTrainConfig

logger = logging.getLogger("medfaq.training")


def build_student(init: str, teacher_dim: int, device: str | None = None) -> Any:
    """The SentenceTransformer `init` ending in a Normalize layer, with a Dense projection to `teacher_dim` before it
    where its own dimension differs (random, seeded by the caller)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize

    model = load_biencoder(init, device)
    modules = list(model)
    while modules and isinstance(modules[-1], Normalize):
        modules.pop()
    dim = int(model.get_embedding_dimension())
    if dim != teacher_dim:
        modules.append(Dense(dim, teacher_dim, activation_function=torch.nn.Identity()))
    return SentenceTransformer(modules=[*modules, Normalize()], device=str(model.device))


def vector_agreement(model: Any, texts: list[str], targets: np.ndarray, batch_size: int = 64) -> dict[str, float]:
    """How close `model`'s unit vectors of `texts` come to `targets` (the teacher's): the mean squared error over
    every component (what MSELoss minimises) and the mean cosine."""
    vectors = model.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True)
    targets = np.asarray(targets, dtype=np.float32)
    return {
        "mse": float(np.mean((vectors - targets) ** 2)),
        "cosine": float(np.mean(np.einsum("ij,ij->i", vectors, targets))),
    }


def train_student(
    texts: list[str],
    targets: np.ndarray,
    config: StudentTrainConfig,
    dev_texts: list[str] | None = None,
    dev_targets: np.ndarray | None = None,
    device: str | None = None,
) -> Any:
    """Fit a student built from `config.init` (:func:`build_student`) to the teacher's vectors `targets` of `texts`
    with MSELoss (texts cut at `config.max_length` tokens, batches of similar length). With dev texts, their
    :func:`vector_agreement` is measured before training and after each epoch (the best epoch, lowest MSE, is
    kept) and written into `config` (`dev_before`, `dev_after`), as are `projection` and the student's
    `fingerprint`. Returns the student (eval mode), reading as many tokens as `config.init`."""
    import torch
    from sentence_transformers.sentence_transformer import losses
    from sentence_transformers.sentence_transformer.modules import Dense
    from sentence_transformers.util import batch_to_device

    seed_everything(config.seed)
    model = build_student(config.init, targets.shape[1], device)
    inference_length = model.max_seq_length
    dense = [module for module in model if isinstance(module, Dense)]
    config.projection = [dense[-1].in_features, dense[-1].out_features] if dense else []
    loss = losses.MSELoss(model)

    def step(batch: list[int]) -> Any:
        features = batch_to_device(model.preprocess([texts[i] for i in batch]), model.device)
        labels = torch.from_numpy(np.ascontiguousarray(targets[batch], dtype=np.float32)).to(model.device)
        return loss([features], labels)

    def measure() -> dict[str, float]:
        trained_length, model.max_seq_length = model.max_seq_length, inference_length  # as the saved model reads
        try:
            return vector_agreement(model, dev_texts or [], dev_targets, config.batch_size)
        finally:
            model.max_seq_length = trained_length

    if dev_texts:
        config.dev_before = measure()
        logger.info("dev before training: %s", config.dev_before)
    model.max_seq_length = config.max_length or inference_length
    train_loop(
        model,
        step,
        list(range(len(texts))),
        config,
        desc="student (mse to the teacher)",
        dev_score=(lambda: -measure()["mse"]) if dev_texts else None,
        length=lambda i: len(texts[i]),
    )
    model.max_seq_length = inference_length
    if dev_texts:
        config.dev_after = measure()
        logger.info("dev after training: %s", config.dev_after)
    config.fingerprint = model_fingerprint(model)
    return model
