"""The summarizer training config (``train_config.json`` beside every checkpoint), its variants and presets."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from medfaq.common.model_kinds import KIND_KEY, QUESTION_WRITER, SUMMARIZER, TRAIN_CONFIG
from medfaq.common.runtime import PRECISION_HELP, PRECISIONS, MedfaqError
from medfaq.common.settings import check_setting, declared_settings, setting
from medfaq.summarizer.modeling import backbone_is_causal

VARIANTS = ("ecl", "mle", "ecl-s", "ecl-h", "qfcl", "learned", "rank")
DIRECTIONS = ("summarize", "ask")
CONFIG_FILE = TRAIN_CONFIG
RETRIEVAL_NEGATIVES_FILE = "retrieval_negatives.jsonl"  # beside a model trained with retrieval negatives


@dataclass
class SummarizerTrainConfig:
    """Everything a training run depends on; saved as ``train_config.json`` beside every checkpoint."""

    backbone: str = setting(
        "minilm", help="minilm, gemma-3-270m, a directory, or a HF seq2seq or causal-LM id.", flag=True
    )
    direction: str = setting(
        "summarize",
        help="summarize: CHQ -> FAQ question (the summarizer); ask: FAQ -> the consumer questions it answers (the "
        "question writer).",
        choices=DIRECTIONS,
    )
    variant: str = setting("ecl", help="The training objective (summarizer/training/trainer.py).", choices=VARIANTS)
    preset: str = "quick"
    alpha: float = setting(1.0, help="Weight of the simple-negative loss.", flag=True, ge=0)  # L_scl (queue negatives)
    beta: float = setting(1.0, help="Weight of the hard-negative loss.", flag=True, ge=0)  # L_hcl (hard or learned)
    label_smoothing: float = setting(0.1, help="Label smoothing of the cross-entropy.", flag=True, ge=0, le=1)
    # see `trainer.sized_momentum` and `trainer.sized_queue`
    momentum: float = setting(0.0, help="Key encoder momentum (0: sized to the run).", flag=True, ge=0, le=1)
    queue_size: int = setting(0, help="Queued FAQ keys (0: half the data).", flag=True, ge=0)
    temperature: float = setting(0.07, help="Temperature of the contrastive losses.", flag=True, gt=0)
    learned_temperature: float = setting(
        1.0, help="Variant learned: temperature against the learned negatives (the paper's 1.0).", flag=True, gt=0
    )
    n_hard_negatives: int = setting(
        4, help="Hard negatives per pair: FAQs sharing its entities (qfcl: its focus).", flag=True, ge=0
    )
    n_frame_negatives: int = setting(  # see frame_hard_negatives
        0, help="Extra hard negatives per pair with the FAQ's question frame swapped.", flag=True, ge=0
    )
    n_learned_negatives: int = setting(
        4, help="Variant learned: negatives the generator makes per pair.", flag=True, ge=0
    )
    n_retrieval_negatives: int = setting(
        0,
        help="Extra hard negatives per pair: the FAQ questions dense search ranks highest for its CHQ, not its FAQ.",
        flag="--retrieval-negatives",
        ge=0,
    )
    retrieval_negatives: str = ""  # their JSONL ({"chq", "negatives"}), saved beside the model when training starts
    diversity_weight: float = setting(
        1.0, help="Variant learned: weight of the generator's diversity loss.", flag=True, ge=0
    )
    # variant rank: L = L_ce + rank_weight x L_rank, L_rank the cross-entropy of the reference FAQ among its hard
    # negatives under the softmax of (log P(FAQ | CHQ) - rank_prior x log P(FAQ | no CHQ)) / rank_temperature, the
    # log-probabilities summed over the FAQ's tokens: the score the pipeline's likelihood stage ranks hits by
    rank_weight: float = setting(
        1.0, help="Variant rank: weight of the FAQ-among-its-hard-negatives likelihood loss.", flag=True, ge=0
    )
    rank_prior: float = setting(
        1.0, help="Variant rank: weight of log P(FAQ | no question) subtracted from each score.", flag=True, ge=0
    )
    rank_temperature: float = setting(
        1.0, help="Variant rank: temperature of the softmax over the summed scores.", flag=True, gt=0
    )
    generator_lr: float = setting(1e-4, help="Variant learned: the generator's learning rate.", flag=True, gt=0)
    lr: float = setting(1e-4, help="Learning rate.", flag=True, gt=0)
    freeze_embeddings: bool = setting(  # the (tied) token embedding stays as loaded
        True,
        help="Decoder-only backbones: freeze the token embedding.",
        flag="--freeze-embeddings/--train-embeddings",
    )
    lora_rank: int = setting(  # rank-r LoRA adapters of every linear layer, trained instead of the weights
        0, help="Decoder-only backbones: train LoRA adapters of this rank (0: full weights).", flag=True, ge=0
    )
    weight_decay: float = setting(0.01, help="AdamW weight decay.", flag=True, ge=0)
    warmup_ratio: float = setting(
        0.1, help="Share of the steps the learning rate warms up over.", flag=True, ge=0, le=1
    )
    max_grad_norm: float = 1.0
    batch_size: int = setting(8, help="Pairs per batch.", flag=True, ge=1)
    grad_accum: int = setting(1, help="Batches per optimizer step.", flag=True, ge=1)
    epochs: int = setting(2, help="Epochs over the training pairs.", flag=True, ge=1)
    max_source_len: int = setting(96, help="Tokens of the question read.", flag=True, ge=1)
    max_target_len: int = setting(40, help="Tokens of the summary trained on.", flag=True, ge=1)
    eval_beams: int = setting(1, help="Beams of the validation summaries.", flag=True, ge=1)
    eval_max_length: int = setting(32, help="Tokens of a validation summary at most.", flag=True, ge=1)
    eval_examples: int = setting(30, help="Validate on the first N pairs.", flag=True, ge=0)  # 0: all
    patience: int = setting(2, help="Early stopping after N epochs without gain.", flag=True, ge=0)
    seed: int = 0
    train_data: str = setting(  # empty: the data set's train split
        "",
        help="Training pairs instead of DATA:train, e.g. meqsum:train+meqsum:valid for a final model (its "
        "validation then scores pairs it trained on: keep last/, with a recipe chosen on a held-out valid split).",
        flag=True,
    )
    pretrain: list[str] = field(default_factory=list)  # CHQ->FAQ data sets trained on before the main data
    pretrain_epochs: int = setting(1, help="Epochs over the pre-training pairs.", flag=True, ge=0)
    pretrain_examples: int = setting(0, help="Sample N pre-training pairs.", flag=True, ge=0)  # 0: all
    device: str | None = None
    threads: int = setting(0, help="Torch CPU threads.", flag=True, ge=0)  # 0: torch's default
    # training forward passes; auto: bf16 where measured faster (the precision used is saved)
    precision: str = setting("auto", help=PRECISION_HELP, flag=True, choices=PRECISIONS)
    save_every_steps: int = setting(  # 0: at epoch ends only
        0, help="Also checkpoint every N optimizer steps.", flag=True, ge=0
    )
    max_steps: int = setting(0, help="Stop with a checkpoint after N steps.", flag=True, ge=0)  # 0: no limit
    averaged_from: list[str] = field(default_factory=list)  # runs whose weights this model averages (soup)

    def __post_init__(self) -> None:
        for declared in declared_settings(SummarizerTrainConfig).values():
            check_setting(declared, getattr(self, declared.name))
        if self.variant == "rank" and self.hard_slots == 0:
            raise MedfaqError(
                "variant rank ranks the FAQ among hard negatives: give --n-hard-negatives or --retrieval-negatives"
            )

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
