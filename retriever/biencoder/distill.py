"""A fast student fitted to a better teacher (sentence-transformers' model distillation recipe, Reimers & Gurevych,
EMNLP 2020): the mean squared error between the student's sentence vectors and the teacher's
(``sentence_transformers.losses.MSELoss``), over the question texts of :mod:`retriever.biencoder.distill_data`.

The student learns the teacher in one of two spaces (`StudentTrainConfig.teacher_space`):

* ``aligned`` (default): the teacher's vectors are brought into the student's own space, so the student starts
  near its targets and adds no layer. They are reduced to the student's width along their principal directions
  (sentence-transformers' recipe for a narrower student), then turned by the rotation that best maps them onto the
  student's vectors of the same texts (orthogonal Procrustes). A rotation changes no cosine, so the targets rank as
  the teacher does, up to the dropped directions (`teacher_variance_kept` says how much of the teacher they keep).
* ``projection``: the student gets a Dense projection (linear, no activation) to the teacher's width after its
  pooling, started at random, and learns the teacher's vectors as they are; an index then stores twice the floats.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from medfaq.common.runtime import MedfaqError, seed_everything
from medfaq.index.model_files import model_fingerprint
from medfaq.retriever.biencoder.scorer import load_biencoder
from medfaq.retriever.biencoder.student_config import StudentTrainConfig
from medfaq.retriever.training.loop import train_loop

logger = logging.getLogger("medfaq.training")


def build_student(init: str, teacher_dim: int | None, device: str | None = None) -> Any:
    """The SentenceTransformer `init` ending in a Normalize layer, with a Dense projection to `teacher_dim` before it
    where that differs from its own dimension (random, seeded by the caller; None: none)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize

    model = load_biencoder(init, device)
    modules = list(model)
    while modules and isinstance(modules[-1], Normalize):
        modules.pop()
    dim = int(model.get_embedding_dimension())
    if teacher_dim is not None and dim != teacher_dim:
        modules.append(Dense(dim, teacher_dim, activation_function=torch.nn.Identity()))
    return SentenceTransformer(modules=[*modules, Normalize()], device=str(model.device))


def check_alignable(width: int | None, teacher_width: int | None, texts: int) -> None:
    """A one-line error where the aligned teacher space cannot be fitted for a student `width` wide: the teacher
    must be at least as wide, and its `width` principal directions need as many training `texts` (a width not
    known, None, is not checked). `medfaq train student` checks this before the teacher encodes anything."""
    if width and teacher_width and width > teacher_width:
        raise MedfaqError(f"a student {width} wide cannot align to a teacher {teacher_width} wide; use projection")
    if width and texts < width:
        raise MedfaqError(
            f"--teacher-space aligned brings the teacher down to the student's {width} dimensions along the main "
            f"directions of the training texts, and there are only {texts}: give --max-texts a larger number, "
            "or use --teacher-space projection"
        )


def aligned_teacher_map(
    student: Any, texts: list[str], targets: np.ndarray, sample: int = 8192, seed: int = 0
) -> tuple[np.ndarray, float]:
    """The linear map (teacher width x student width) that brings the teacher's vectors into `student`'s space (see
    the module docstring), fitted on a seeded sample of `texts`; and the share of the teacher's squared singular
    values the kept directions hold."""
    chosen = np.sort(np.random.default_rng(seed).permutation(len(texts))[:sample])
    teacher = np.asarray(targets[chosen], dtype=np.float64)
    width = int(student.get_embedding_dimension())
    check_alignable(width, teacher.shape[1], len(chosen))
    _, singular, directions = np.linalg.svd(teacher, full_matrices=False)
    reduce = directions[:width].T
    reduced = unit_rows(teacher @ reduce)
    own = student.encode([texts[i] for i in chosen], batch_size=64, convert_to_numpy=True, normalize_embeddings=True)
    left, _, right = np.linalg.svd(reduced.T @ np.asarray(own, dtype=np.float64))
    kept = float((singular[:width] ** 2).sum() / (singular**2).sum())
    return (reduce @ left @ right).astype(np.float32), kept


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


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
    kept) and written into `config` (`dev_before`, `dev_after`; against the targets in the space learnt), as are
    `projection`, `teacher_variance_kept` and the student's `fingerprint`. Returns the student (eval mode), reading
    as many tokens as `config.init`."""
    import torch
    from sentence_transformers.sentence_transformer import losses
    from sentence_transformers.sentence_transformer.modules import Dense
    from sentence_transformers.util import batch_to_device

    seed_everything(config.seed)
    if config.teacher_space == "aligned":
        model = build_student(config.init, None, device)
        mapping, config.teacher_variance_kept = aligned_teacher_map(model, texts, targets, seed=config.seed)
        targets = unit_rows(np.asarray(targets, dtype=np.float32) @ mapping)
        if dev_targets is not None:
            dev_targets = unit_rows(np.asarray(dev_targets, dtype=np.float32) @ mapping)
        logger.info("teacher aligned to the student's space, %.1f %% of it kept", 100 * config.teacher_variance_kept)
    else:
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
