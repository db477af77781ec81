"""The summarizer training config (``train_config.json`` beside every checkpoint), its variants and presets."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from medfaq.common.model_kinds import KIND_KEY, QUESTION_WRITER, SUMMARIZER, TRAIN_CONFIG
from medfaq.common.runtime import PRECISIONS, MedfaqError
from medfaq.summarizer.modeling import backbone_is_causal

VARIANTS = ("ecl", "mle", "ecl-s", "ecl-h", "qfcl", "learned", "rank")
# summarize: CHQ -> FAQ question (the summarizer); ask: FAQ -> the consumer questions it answers (the question writer)
DIRECTIONS = ("summarize", "ask")
CONFIG_FILE = TRAIN_CONFIG
RETRIEVAL_NEGATIVES_FILE = "retrieval_negatives.jsonl"  # beside a model trained with retrieval negatives


@dataclass
class SummarizerTrainConfig:
    """Everything a training run depends on; saved as ``train_config.json`` beside every checkpoint."""

    backbone: str = "minilm"
    direction: str = "summarize"
    variant: str = "ecl"
    preset: str = "quick"
    alpha: float = 1.0  # weight of L_scl (queue negatives)
    beta: float = 1.0  # weight of L_hcl (hard or learned negatives)
    label_smoothing: float = 0.1
    momentum: float = 0.0  # key-encoder momentum (0: sized to the run, see `trainer.sized_momentum`)
    queue_size: int = 0  # queued FAQ keys (0: sized to the data, see `trainer.sized_queue`)
    temperature: float = 0.07
    learned_temperature: float = 1.0  # InfoNCE temperature against learned negatives (the paper's 1.0)
    n_hard_negatives: int = 4
    n_frame_negatives: int = 0  # extra hard negatives with the FAQ's question frame swapped (see frame_hard_negatives)
    n_learned_negatives: int = 4
    n_retrieval_negatives: int = 0  # extra hard negatives per pair: the retrieval's near misses for its CHQ
    retrieval_negatives: str = ""  # their JSONL ({"chq", "negatives"}), saved beside the model when training starts
    diversity_weight: float = 1.0
    # variant rank: L = L_ce + rank_weight x L_rank, L_rank the cross-entropy of the reference FAQ among its hard
    # negatives under the softmax of (log P(FAQ | CHQ) - rank_prior x log P(FAQ | no CHQ)) / rank_temperature, the
    # log-probabilities summed over the FAQ's tokens: the score the pipeline's likelihood stage ranks hits by
    rank_weight: float = 1.0
    rank_prior: float = 1.0
    rank_temperature: float = 1.0
    generator_lr: float = 1e-4
    lr: float = 1e-4
    freeze_embeddings: bool = True  # decoder-only backbones: keep the (tied) token embedding frozen
    lora_rank: int = 0  # decoder-only backbones: train rank-r LoRA adapters of every linear layer instead (0: off)
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    batch_size: int = 8
    grad_accum: int = 1
    epochs: int = 2
    max_source_len: int = 96
    max_target_len: int = 40
    eval_beams: int = 1
    eval_max_length: int = 32
    eval_examples: int = 30  # validate on the first N validation pairs (0: all)
    patience: int = 2
    seed: int = 0
    train_data: str = ""  # training pairs spec (e.g. meqsum:train+meqsum:valid); empty: the data set's train split
    pretrain: list[str] = field(default_factory=list)  # CHQ->FAQ data sets trained on before the main data
    pretrain_epochs: int = 1
    pretrain_examples: int = 0  # sample this many pre-training pairs (0: all)
    device: str | None = None
    threads: int = 0  # torch threads (0: torch's default)
    precision: str = "auto"  # training forward passes: fp32 | bf16 | auto (bf16 where measured faster; the one used)
    save_every_steps: int = 0  # also checkpoint every N optimizer steps (0: at epoch ends only)
    max_steps: int = 0  # stop (with a checkpoint) after N optimizer steps in total (0: no limit)
    averaged_from: list[str] = field(default_factory=list)  # runs whose weights this model averages (soup)

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise MedfaqError(f"unknown direction {self.direction!r}; choose one of {', '.join(DIRECTIONS)}")
        if self.variant not in VARIANTS:
            raise MedfaqError(f"unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        if self.batch_size < 1 or self.grad_accum < 1 or self.epochs < 1:
            raise MedfaqError("batch size, gradient accumulation and epochs must be at least 1")
        counts = (self.n_hard_negatives, self.n_frame_negatives, self.n_learned_negatives, self.n_retrieval_negatives)
        if min(counts) < 0:
            raise MedfaqError("the numbers of hard, frame, learned and retrieval negatives must be 0 or more")
        if self.lora_rank < 0:
            raise MedfaqError(f"--lora-rank must be 0 (off) or positive, got {self.lora_rank}")
        if min(self.rank_weight, self.rank_prior) < 0:
            raise MedfaqError("--rank-weight and --rank-prior must be 0 or more")
        if self.rank_temperature <= 0:
            raise MedfaqError(f"--rank-temperature must be positive, got {self.rank_temperature}")
        if self.variant == "rank" and self.hard_slots == 0:
            raise MedfaqError(
                "variant rank ranks the FAQ among hard negatives: give --n-hard-negatives or --retrieval-negatives"
            )
        if self.precision not in PRECISIONS:
            raise MedfaqError(f"unknown precision {self.precision!r}; choose one of {', '.join(PRECISIONS)}")

    @property
    def uses_queue(self) -> bool:
        return self.variant in {"ecl", "ecl-h", "qfcl", "learned"}

    @property
    def uses_hard(self) -> bool:
        return self.variant in {"ecl", "ecl-s", "qfcl", "rank"}

    @property
    def hard_slots(self) -> int:
        """Hard negatives per pair the contrastive loss reads: entity (or focus), frame and retrieval ones."""
        return self.n_hard_negatives + self.n_frame_negatives + self.n_retrieval_negatives if self.uses_hard else 0

    @property
    def uses_moco(self) -> bool:
        return self.variant not in {"mle", "rank"}

    @property
    def kind(self) -> str:
        """The kind of model this run trains, as its saved config declares it (common/model_kinds.py)."""
        return QUESTION_WRITER if self.direction == "ask" else SUMMARIZER

    def save(self, directory: Path) -> None:
        values = {KIND_KEY: self.kind, **dataclasses.asdict(self)}
        (directory / CONFIG_FILE).write_text(json.dumps(values, indent=2) + "\n", encoding="utf-8")

    @classmethod
    def unknown_keys(cls, values: dict) -> list[str]:
        """The keys of `values` that name no setting of this config, sorted."""
        return sorted(set(values) - {f.name for f in dataclasses.fields(cls)})

    @classmethod
    def load(cls, directory: Path) -> SummarizerTrainConfig:
        values = json.loads((Path(directory) / CONFIG_FILE).read_text(encoding="utf-8"))
        values.pop(KIND_KEY, None)  # what the settings make (`kind`), not a setting
        unknown = cls.unknown_keys(values)
        if unknown:
            raise MedfaqError(f"{directory} is not a trained summarizer (its {CONFIG_FILE} has {', '.join(unknown)})")
        return cls(**values)


PRESETS: dict[str, dict] = {
    # Up to 8 epochs over MeQSum train (400 pairs), 96 source tokens, validation on 50 pairs, early stopping after
    # 3 epochs without gain: about 12 CPU-core minutes for an ECL run with the MiniLM backbone. With 2 epochs (the
    # dataclass default) every variant wrote a few generic questions; with 8 the contrastive ones do not
    # (docs/results.md).
    "quick": {"epochs": 8, "patience": 3, "eval_examples": 50},
    # The paper's setting for a GPU: longer inputs, more epochs, beam search for validation.
    "full": {
        "lr": 3e-5,
        "epochs": 20,
        "eval_examples": 0,
        "batch_size": 16,
        "max_source_len": 512,
        "max_target_len": 64,
        "eval_beams": 4,
        "eval_max_length": 64,
        "patience": 4,
    },
}
QFCL_DEFAULTS = {"alpha": 1.0, "beta": 0.5}
# Decoder-only backbones (Gemma 3 270M): the plain fine-tune recipe that scored ROUGE-1 50.5 on all 500 MeQSum test
# pairs; about 7-8 times the step cost of the MiniLM encoder-decoder, so 2 epochs and a short validation.
CAUSAL_PRESETS: dict[str, dict] = {
    "quick": {"epochs": 2, "lr": 5e-5, "max_source_len": 120, "eval_examples": 20, "eval_max_length": 40},
    "full": {"lr": 2e-5, "epochs": 6, "max_source_len": 256},
}


def preset_config(preset: str = "quick", variant: str = "ecl", **overrides) -> SummarizerTrainConfig:
    """The preset's config for `variant`, with every override that is not None applied."""
    if preset not in PRESETS:
        raise MedfaqError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    values = {"preset": preset, "variant": variant, **PRESETS[preset]}
    if backbone_is_causal(overrides.get("backbone") or "minilm"):
        values.update(CAUSAL_PRESETS[preset])
    if variant == "qfcl":
        values.update(QFCL_DEFAULTS)
    values.update({key: value for key, value in overrides.items() if value is not None})
    unknown = SummarizerTrainConfig.unknown_keys(values)
    if unknown:
        raise MedfaqError(f"unknown training options: {', '.join(unknown)}")
    return SummarizerTrainConfig(**values)
