"""The config of a distilled student (``train_config.json`` beside it): an :class:`EncoderTrainConfig` of task
``distill`` and loss ``mse``, so every reader of a trained model's config takes the student for the bi-encoder it is,
plus what it was distilled from and how close it came."""

from __future__ import annotations

from dataclasses import dataclass, field

from medfaq.common.runtime import ENCODER_BACKENDS, MedfaqError
from medfaq.retriever.training.config import DISTILL_TASK, EncoderTrainConfig

TEACHER_SPACES = ("aligned", "projection")


@dataclass
class StudentTrainConfig(EncoderTrainConfig):
    """One distillation run: the teacher and its vectors' backend, the texts (a seeded sample of at most
    `max_texts`, `dev_fraction` of them held out), the optimisation, and what training measured."""

    model_type: str = "biencoder"
    task: str = DISTILL_TASK
    loss: str = "mse"
    epochs: int = 1
    batch_size: int = 64
    lr: float = 1e-4
    max_length: int | None = 128  # tokens read in training; the saved student reads as far as `init` did
    dev_fraction: float = 0.05
    teacher: str = "mpnet"
    teacher_backend: str = "auto"  # auto: torch on a GPU; on the CPU the int8 graph where its check passed, else fp32
    max_texts: int | None = None
    teacher_space: str = "aligned"  # aligned | projection (retriever/biencoder/distill.py)
    teacher_fingerprint: str = ""  # filled in by training, as everything below
    projection: list[int] = field(default_factory=list)  # [student dim, teacher dim] of the Dense layer added, if any
    teacher_variance_kept: float | None = None  # aligned: the share of the teacher's squared singular values kept
    text_counts: dict[str, int] = field(default_factory=dict)  # texts per source (training and dev)
    n_dev_texts: int = 0
    dev_before: dict[str, float] = field(default_factory=dict)  # mse and mean cosine to the teacher on the dev texts
    dev_after: dict[str, float] = field(default_factory=dict)
    fingerprint: str = ""  # the student's weights (index.model_files.model_fingerprint)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.task != DISTILL_TASK or self.model_type != "biencoder":
            raise MedfaqError("a student is a bi-encoder of task distill")
        if self.teacher_backend not in ENCODER_BACKENDS:
            raise MedfaqError(
                f"unknown teacher backend {self.teacher_backend!r}; choose one of {', '.join(ENCODER_BACKENDS)}"
            )
        if self.teacher_space not in TEACHER_SPACES:
            raise MedfaqError(
                f"unknown teacher space {self.teacher_space!r}; choose one of {', '.join(TEACHER_SPACES)}"
            )
        if self.max_texts is not None and self.max_texts < 2:
            raise MedfaqError("--max-texts must be at least 2")
