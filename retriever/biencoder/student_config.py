"""The config of a distilled student (``train_config.json`` beside it): an :class:`EncoderTrainConfig` of task
``distill`` and loss ``mse``, so every reader of a trained model's config takes the student for the bi-encoder it is,
plus what it was distilled from and how close it came."""

from __future__ import annotations

from dataclasses import dataclass, field

from medfaq.common.runtime import ENCODER_BACKENDS, MedfaqError
from medfaq.common.settings import check_setting, declared_settings, setting
from medfaq.retriever.training.config import DISTILL_TASK, EncoderTrainConfig

TEACHER_SPACES = ("aligned", "projection")


@dataclass
class StudentTrainConfig(EncoderTrainConfig):
    """One distillation run: the teacher and its vectors' backend, the texts (a seeded sample of at most
    `max_texts`, `dev_fraction` of them held out), the optimisation, and what training measured."""

    model_type: str = "biencoder"
    task: str = DISTILL_TASK
    loss: str = "mse"
    init: str = setting("minilm", help="The student's starting weights: minilm, a directory or a name.", flag=True)
    seed: int = setting(0, help="Random seed.", flag=True)
    epochs: int = setting(1, help="Epochs over the training texts.", flag=True, ge=1)
    batch_size: int = setting(64, help="Texts per batch.", flag=True, ge=1)
    lr: float = setting(1e-4, help="Learning rate.", flag=True, gt=0)
    max_length: int | None = setting(  # the saved student reads as far as `init` did
        128, help="Tokens read in training (the student keeps its own limit).", flag=True, ge=8
    )
    dev_fraction: float = setting(
        0.05,
        help="Texts held out: the student's MSE and mean cosine to the teacher on them, before and after training.",
        flag=True,
        ge=0,
        le=0.5,
    )
    teacher: str = setting("mpnet", help="The encoder the student learns: mpnet, a directory or a name.", flag=True)
    teacher_backend: str = setting(
        "auto",
        help="What encodes the teacher's vectors (once); auto: torch on a GPU, on the CPU bf16 weights where the CPU "
        "measures bf16 fast, else ONNX int8 where its check passed, else ONNX fp32.",
        flag=True,
        choices=ENCODER_BACKENDS,
    )
    max_texts: int | None = setting(
        None, help="Distil on a seeded sample of at most N texts (quick runs).", flag=True, ge=2
    )
    teacher_space: str = setting(  # retriever/biencoder/distill.py
        "aligned",
        help="aligned: the teacher reduced to the student's width and rotated onto its space (no layer added); "
        "projection: a Dense layer to the teacher's width.",
        flag=True,
        choices=TEACHER_SPACES,
    )
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
        for declared in declared_settings(StudentTrainConfig).values():
            check_setting(declared, getattr(self, declared.name))
