"""ECL training: label-smoothed cross-entropy + α·L_scl (queue negatives) + β·L_hcl (entity hard negatives).

One trainer runs every variant (`VARIANTS`): ``ecl``, ``mle`` (= ECL−s−h), ``ecl-s`` (no simple negatives), ``ecl-h``
(no hard negatives), ``qfcl`` (focus hard negatives and a decoder anchor: L = L_ce + ½(α·L_scl + β·L_hcl)_enc +
½(α·L_scl + β·L_hcl)_dec, with α = 1, β = 0.5) and ``learned`` (queue negatives plus K negatives made by a small
generator trained adversarially to maximise the contrastive loss at its own temperature, with a diversity loss).

Backbones: seq2seq (anchor = the encoder's CHQ states) or decoder-only causal LMs (input = CHQ + separator + FAQ, loss
and LM-head logits on the FAQ tokens only, anchor = the CHQ tokens' last hidden states, embedding frozen by default;
``lora_rank`` trains LoRA adapters (peft) instead of the weights). The momentum key encoder copies only the trainable
parameters and shares the frozen ones.

The output directory is a ready summarizer (best checkpoint by validation ROUGE-L: model in safetensors, tokenizer,
``train_config.json``, ``history.json``); ``<out>/last`` holds the resume checkpoint (model, optimizer, scheduler,
key encoder, queue, RNG states, epoch and step; with LoRA the adapter instead of the model).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from medfaq.common.runtime import PRECISIONS, MedfaqError, autocast, choose_device, resolve_precision, seed_everything
from medfaq.summarizer.modeling import backbone_is_causal, is_causal_lm, load_backbone
from medfaq.summarizer.training.contrastive import MoCo, diversity_loss, info_nce, masked_mean, mean_cosine

logger = logging.getLogger("medfaq")

VARIANTS = ("ecl", "mle", "ecl-s", "ecl-h", "qfcl", "learned")
CONFIG_FILE = "train_config.json"
HISTORY_FILE = "history.json"
STATE_FILE = "trainer_state.pt"
LAST_DIR = "last"


@dataclass
class SummarizerTrainConfig:
    """Everything a training run depends on; saved as ``train_config.json`` beside every checkpoint."""

    backbone: str = "minilm"
    variant: str = "ecl"
    preset: str = "quick"
    alpha: float = 1.0  # weight of L_scl (queue negatives)
    beta: float = 1.0  # weight of L_hcl (hard or learned negatives)
    label_smoothing: float = 0.1
    momentum: float = 0.0  # key-encoder momentum (0: sized to the run, see `sized_momentum`)
    queue_size: int = 0  # queued FAQ keys (0: sized to the data, see `sized_queue`)
    temperature: float = 0.07
    learned_temperature: float = 1.0  # InfoNCE temperature against learned negatives (the paper's 1.0)
    n_hard_negatives: int = 4
    n_frame_negatives: int = 0  # extra hard negatives with the FAQ's question frame swapped (see frame_hard_negatives)
    n_learned_negatives: int = 4
    diversity_weight: float = 1.0
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
        if self.variant not in VARIANTS:
            raise MedfaqError(f"unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        if self.batch_size < 1 or self.grad_accum < 1 or self.epochs < 1:
            raise MedfaqError("batch size, gradient accumulation and epochs must be at least 1")
        if min(self.n_hard_negatives, self.n_frame_negatives, self.n_learned_negatives) < 0:
            raise MedfaqError("the numbers of hard, frame and learned negatives must be 0 or more")
        if self.lora_rank < 0:
            raise MedfaqError(f"--lora-rank must be 0 (off) or positive, got {self.lora_rank}")
        if self.precision not in PRECISIONS:
            raise MedfaqError(f"unknown precision {self.precision!r}; choose one of {', '.join(PRECISIONS)}")

    @property
    def uses_queue(self) -> bool:
        return self.variant in {"ecl", "ecl-h", "qfcl", "learned"}

    @property
    def uses_hard(self) -> bool:
        return self.variant in {"ecl", "ecl-s", "qfcl"}

    @property
    def uses_moco(self) -> bool:
        return self.variant != "mle"

    def save(self, directory: Path) -> None:
        (directory / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def unknown_keys(cls, values: dict) -> list[str]:
        """The keys of `values` that name no setting of this config, sorted."""
        return sorted(set(values) - {f.name for f in dataclasses.fields(cls)})

    @classmethod
    def load(cls, directory: Path) -> SummarizerTrainConfig:
        values = json.loads((Path(directory) / CONFIG_FILE).read_text(encoding="utf-8"))
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


def sized_queue(n_examples: int, batch_size: int, limit: int = 4096) -> int:
    """Queue length for a data set: half an epoch of FAQ keys (no stale copies of one FAQ), at most `limit`."""
    return max(batch_size, min(limit, n_examples // 2))


def sized_momentum(steps_total: int) -> float:
    """Key-encoder momentum for a run of `steps_total` optimizer steps: 1 − 10/steps, within [0.9, 0.999], so the
    key encoder follows the query encoder within about a tenth of the run (0.999 suits 10,000+ steps)."""
    return min(0.999, max(0.9, 1.0 - 10.0 / max(steps_total, 1)))


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


@dataclass(frozen=True)
class Example:
    """One training pair with its own hard negatives (kept together through batching)."""

    id: int
    chq: str
    faq: str
    negatives: tuple[str, ...] = ()


@dataclass
class Batch:
    """One micro-batch. Seq2seq: `source` is the CHQ, `labels` the FAQ. Decoder-only: `source` is CHQ + separator +
    FAQ + EOS and `labels` is -100 except on the FAQ and EOS. `keys` holds the FAQs (B rows) followed by the valid
    hard negatives, for one batched key-encoder pass; `negative_mask` (B, n_h) marks which slots those fill."""

    ids: torch.Tensor
    source: dict[str, torch.Tensor]
    anchor_mask: torch.Tensor  # (B, T_source): the CHQ tokens the anchor is pooled over
    labels: torch.Tensor
    keys: dict[str, torch.Tensor]  # input_ids, attention_mask, pool_mask: (B + valid negatives, T)
    negative_mask: torch.Tensor

    def to(self, device: str) -> Batch:
        def move(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {key: value.to(device) for key, value in tensors.items()}

        return Batch(
            self.ids.to(device),
            move(self.source),
            self.anchor_mask.to(device),
            self.labels.to(device),
            move(self.keys),
            self.negative_mask.to(device),
        )


@dataclass(frozen=True)
class EncodedExample:
    """An example's token ids, computed once per run."""

    source: list[int]
    anchor: list[int]  # 1 where `source` holds a CHQ token the anchor pools over
    labels: list[int]
    keys: list[list[int]]  # the FAQ, then its hard negatives
    key_pools: list[list[int]]


def pad(rows: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    """Right-pad integer rows to one (N, T) tensor."""
    width = max((len(row) for row in rows), default=1) or 1
    return torch.tensor([list(row) + [value] * (width - len(row)) for row in rows], dtype=torch.long)


class Collator:
    """Tokenizes each example once (cached by id) and pads batches; hard negatives fill up to `n_hard` slots.

    `causal`: the decoder-only layout (see :class:`Batch`). `strip_start`: a token id dropped from the front of the
    labels (BERT2BERT: its decoder starts from [CLS], so [CLS] is no target).
    """

    def __init__(
        self,
        tokenizer,
        max_source_len: int,
        max_target_len: int,
        n_hard: int,
        causal: bool = False,
        strip_start: int | None = None,
    ):
        self.tokenizer, self.n_hard, self.causal, self.strip_start = tokenizer, n_hard, causal, strip_start
        self.max_source_len, self.max_target_len = max_source_len, max_target_len
        self.special = set(tokenizer.all_special_ids)
        self._cache: dict[int, EncodedExample] = {}

    def _ids(self, text: str, max_len: int, special: bool = True) -> list[int]:
        return self.tokenizer(text, max_length=max_len, truncation=True, add_special_tokens=special)["input_ids"]

    def _pool(self, ids: list[int]) -> list[int]:
        """Decoder-only keys pool over text tokens only (Gemma's BOS state is huge and the same for every input)."""
        return [int(not self.causal or token not in self.special) for token in ids]

    def encode(self, example: Example) -> EncodedExample:
        cached = self._cache.get(example.id)
        if cached is not None:
            return cached
        keys = [self._ids(text, self.max_target_len) for text in (example.faq, *example.negatives[: self.n_hard])]
        if self.causal:
            from medfaq.summarizer.modeling import clean_question, prompt_ids

            prompt, n_question = prompt_ids(self.tokenizer, example.chq, self.max_source_len)
            answer = self._ids(" " + clean_question(example.faq), self.max_target_len, special=False)
            answer.append(self.tokenizer.eos_token_id)
            source, labels = prompt + answer, [-100] * len(prompt) + answer
            anchor = [int(i < n_question and token not in self.special) for i, token in enumerate(source)]
        else:
            source = self._ids(example.chq, self.max_source_len)
            anchor = [1] * len(source)
            labels = keys[0][1:] if self.strip_start is not None and keys[0][:1] == [self.strip_start] else keys[0]
        encoded = EncodedExample(source, anchor, labels, keys, [self._pool(ids) for ids in keys])
        self._cache[example.id] = encoded
        return encoded

    def __call__(self, examples: Sequence[Example]) -> Batch:
        encoded = [self.encode(e) for e in examples]
        pad_id = self.tokenizer.pad_token_id
        sources = [e.source for e in encoded]
        source = {"input_ids": pad(sources, pad_id), "attention_mask": pad([[1] * len(x) for x in sources], 0)}
        negatives = [e.keys[1:] for e in encoded]
        key_ids = [e.keys[0] for e in encoded] + [ids for e in encoded for ids in e.keys[1:]]
        key_pools = [e.key_pools[0] for e in encoded] + [p for e in encoded for p in e.key_pools[1:]]
        keys = {
            "input_ids": pad(key_ids, pad_id),
            "attention_mask": pad([[1] * len(x) for x in key_ids], 0),
            "pool_mask": pad(key_pools, 0),
        }
        mask = torch.tensor([[slot < len(g) for slot in range(self.n_hard)] for g in negatives], dtype=torch.bool)
        return Batch(
            torch.tensor([e.id for e in examples], dtype=torch.long),
            source,
            pad([e.anchor for e in encoded], 0),
            pad([e.labels for e in encoded], -100),
            keys,
            mask.view(len(examples), self.n_hard),
        )


def epoch_batches(
    examples: Sequence[Example], batch_size: int, seed: int, epoch: int, bucket: int = 8
) -> list[list[Example]]:
    """The epoch's shuffled batches; the order depends only on (seed, epoch), so a resumed run sees the same.

    Within each shuffled window of `bucket` batches, examples are sorted by CHQ length before they are cut into
    batches (less padding, so faster steps); the batches are then shuffled again.
    """
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(len(examples), generator=generator).tolist()
    window = batch_size * max(bucket, 1)
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: len(examples[i].chq))
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    shuffled = torch.randperm(len(batches), generator=generator).tolist()
    return [[examples[i] for i in batches[b]] for b in shuffled]


def build_examples(pairs: Sequence[tuple[str, str]], config: SummarizerTrainConfig, start_id: int = 0) -> list[Example]:
    """Attach each pair's hard negatives as its own group: entity swaps (ECL) or focus swaps (QFCL), then
    `n_frame_negatives` question-frame swaps."""
    chqs, faqs = [p[0] for p in pairs], [p[1] for p in pairs]
    groups: list[list[str]] = [[] for _ in pairs]
    if config.uses_hard:
        from medfaq.summarizer.entities import load_recognizer
        from medfaq.summarizer.training import negatives

        qfcl = config.variant == "qfcl"
        entities: list = []
        if (not qfcl and config.n_hard_negatives > 0) or config.n_frame_negatives > 0:
            recognizer = load_recognizer()
            entities = [recognizer.find(faq) for faq in faqs]
        if config.n_hard_negatives > 0 and qfcl:
            groups = negatives.focus_hard_negatives(chqs, faqs, config.n_hard_negatives, config.seed)
        elif config.n_hard_negatives > 0:
            groups = negatives.entity_hard_negatives(faqs, config.n_hard_negatives, config.seed, entities=entities)
        if config.n_frame_negatives > 0:
            frames = negatives.frame_hard_negatives(faqs, config.n_frame_negatives, config.seed, entities)
            groups = [group + frame for group, frame in zip(groups, frames, strict=True)]
    return [Example(start_id + i, c, f, tuple(g)) for i, (c, f, g) in enumerate(zip(chqs, faqs, groups, strict=True))]


def rouge_l(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Mean stemmed ROUGE-L F1 in percent."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    scores = [scorer.score(ref, pred)["rougeL"].fmeasure for pred, ref in zip(predictions, references, strict=True)]
    return 100.0 * float(np.mean(scores)) if scores else 0.0


class SummarizerTrainer:
    """Trains one variant on CHQ→FAQ pairs; `train()` returns the history (one dict per epoch)."""

    def __init__(self, config: SummarizerTrainConfig, out_dir: Path | str, resume: bool = False):
        self.config, self.out_dir = config, Path(out_dir)
        last = self.out_dir / LAST_DIR
        if resume and not (last / STATE_FILE).is_file():
            raise MedfaqError(f"nothing to resume in {self.out_dir} (no {LAST_DIR}/{STATE_FILE})")
        if not resume and self.out_dir.exists() and any(self.out_dir.iterdir()):
            raise MedfaqError(f"output directory {self.out_dir} is not empty; pass --resume or another --out")
        self.resume = resume
        if config.threads > 0:
            torch.set_num_threads(config.threads)
        seed_everything(config.seed)
        self.device = choose_device(config.device)
        config.precision = resolve_precision(config.precision, self.device)
        # with LoRA, last/ holds the adapter only: the run continues from the backbone plus that adapter
        self.network, self.tokenizer = load_backbone(last if resume and not config.lora_rank else config.backbone)
        self.causal = is_causal_lm(self.network)
        self.model = self.network
        if config.lora_rank:
            if not self.causal:
                raise MedfaqError("--lora-rank needs a decoder-only backbone (e.g. gemma-3-270m)")
            self.model = with_lora(self.network, config.lora_rank, last if resume else None)
        self.model.to(self.device)
        if self.causal:
            self.encoder = self.network.base_model  # the transformer under the LM head: hidden states for anchors
            if config.freeze_embeddings:
                self.network.get_input_embeddings().requires_grad_(False)
        else:
            self.encoder = self.network.get_encoder()
        self.moco: MoCo | None = None
        bert2bert = self.network.config.model_type == "encoder-decoder"
        self.collator = Collator(
            self.tokenizer,
            config.max_source_len,
            config.max_target_len,
            config.n_hard_negatives + config.n_frame_negatives if config.uses_hard else 0,
            causal=self.causal,
            strip_start=self.network.config.decoder_start_token_id if bert2bert else None,
        )
        self.history: list[dict] = []
        self.best_score = -math.inf
        self.bad_epochs = 0
        self.epoch = 0  # epochs finished (of the current stage)
        self.step_in_epoch = 0  # micro-batches finished in the current epoch
        self.global_step = 0  # optimizer steps
        self.stage = "main"

    def build_moco(self, largest_stage: int, steps_total: int) -> None:
        """The key encoder and queue, sized to the run (see :func:`sized_queue` and :func:`sized_momentum`);
        `train` calls it, a caller of `losses` outside `train` calls it first."""
        config = self.config
        if not config.uses_moco:
            return
        dim = (
            self.encoder.config.hidden_size
            if hasattr(self.encoder.config, "hidden_size")
            else self.network.config.d_model
        )
        learned = config.n_learned_negatives if config.variant == "learned" else 0
        queue = config.queue_size or sized_queue(largest_stage, config.batch_size)
        momentum = config.momentum or sized_momentum(steps_total)
        self.moco = MoCo(self.encoder, dim, queue, momentum, config.temperature, learned).to(self.device)
        logger.info("key queue %d, momentum %.4f", queue, momentum)

    # ----- one step -------------------------------------------------------------------------------------------
    def _target_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM-head logits for the selected hidden states only (the vocabulary projection is the costliest layer)."""
        logits = self.network.get_output_embeddings()(hidden)
        softcap = getattr(self.network.config, "final_logit_softcapping", None)
        return torch.tanh(logits / softcap) * softcap if softcap else logits

    def _forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Cross-entropy on the target tokens, the hidden states the anchor pools over, and (QFCL) the decoder's."""
        config, model = self.config, self.model
        want_decoder = config.variant == "qfcl"
        if self.causal:
            mask = batch.source["attention_mask"]
            hidden = self.encoder(
                input_ids=batch.source["input_ids"],
                attention_mask=mask,
                position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            ).last_hidden_state
            targets = batch.labels[:, 1:]
            selected = targets != -100  # position t predicts token t + 1
            logits = self._target_logits(hidden[:, :-1][selected]).float()
            ce = F.cross_entropy(logits, targets[selected], label_smoothing=config.label_smoothing)
            return ce, hidden, hidden if want_decoder else None
        encoder_out = self.encoder(**batch.source)
        out = model(
            attention_mask=batch.source["attention_mask"],
            encoder_outputs=encoder_out,
            decoder_input_ids=model.prepare_decoder_input_ids_from_labels(batch.labels),
            output_hidden_states=want_decoder,
        )
        logits = out.logits.float()
        ce = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)),
            batch.labels.reshape(-1),
            ignore_index=-100,
            label_smoothing=config.label_smoothing,
        )
        return ce, encoder_out.last_hidden_state, out.decoder_hidden_states[-1] if want_decoder else None

    def losses(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float], dict[str, float | None]]:
        """Loss to back-propagate for one micro-batch, its logged parts (``loss``: the model's objective, without
        the learned-negative adversary's term) and the anchor/negative cosines for the history."""
        config = self.config
        ce, anchor_hidden, decoder_hidden = self._forward(batch)
        parts = {"ce": float(ce.detach())}
        cosines: dict[str, float | None] = {}
        if self.moco is None:
            parts["loss"] = parts["ce"]
            return ce, parts, cosines
        tau, size = config.temperature, batch.ids.size(0)
        anchor = masked_mean(anchor_hidden, batch.anchor_mask)
        all_keys = self.moco.keys(**batch.keys)  # positives and hard negatives in one pass
        positive = all_keys[:size]
        anchors = {"": anchor}
        if decoder_hidden is not None:
            anchors["_dec"] = masked_mean(decoder_hidden, (batch.labels != -100).long())
        objective = ce
        queue_keys = queue_mask = hard_keys = None
        if config.uses_queue:
            queue_keys, queue_mask = self.moco.queue.negatives_for(batch.ids)
            cosines["simple"] = mean_cosine(anchor.detach(), queue_keys, queue_mask)
        if config.uses_hard:
            hard_keys = all_keys.new_zeros(*batch.negative_mask.shape, all_keys.size(-1))
            hard_keys[batch.negative_mask] = all_keys[size:]
            cosines["hard"] = mean_cosine(anchor.detach(), hard_keys, batch.negative_mask)
        for suffix, vector in anchors.items():
            contrast = 0.0
            if queue_keys is not None:
                scl = info_nce(vector, positive, queue_keys, queue_mask, tau)
                parts["scl" + suffix] = float(scl.detach())
                contrast = contrast + config.alpha * scl
            if hard_keys is not None:
                hcl = info_nce(vector, positive, hard_keys, batch.negative_mask, tau)
                parts["hcl" + suffix] = float(hcl.detach())
                contrast = contrast + config.beta * hcl
            # QFCL: ½(α·L_scl + β·L_hcl) for each of its two anchors; ECL: α·L_scl + β·L_hcl
            objective = objective + (0.5 * contrast if config.variant == "qfcl" else contrast)
        total = objective
        if self.moco.generator is not None:
            generated = self.moco.generator(positive)
            learned_tau = config.learned_temperature
            lcl = info_nce(anchor, positive, generated.detach(), None, learned_tau)
            adversary = -info_nce(anchor.detach(), positive, generated, None, learned_tau)
            diversity = diversity_loss(generated)
            parts.update(lcl=float(lcl.detach()), diversity=float(diversity.detach()))
            cosines["learned"] = mean_cosine(
                anchor.detach(),
                generated.detach(),
                torch.ones(generated.shape[:2], dtype=torch.bool, device=generated.device),
            )
            objective = objective + config.beta * lcl
            # the generator's parameters only see `adversary + diversity`; the model only sees `lcl`
            total = objective + adversary + config.diversity_weight * diversity
        parts["loss"] = float(objective.detach())
        if config.uses_queue:
            self.moco.queue.enqueue(positive, batch.ids)
        return total, parts, cosines

    # ----- the loop -------------------------------------------------------------------------------------------
    def _optimizers(self, steps_total: int):
        from transformers import get_linear_schedule_with_warmup

        config = self.config
        decay, no_decay = [], []
        for name, param in self.model.named_parameters():
            if not param.requires_grad:
                continue
            (no_decay if param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(param)
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=config.lr,
        )
        warmup = int(config.warmup_ratio * steps_total)
        scheduler = get_linear_schedule_with_warmup(optimizer, warmup, max(steps_total, 1))
        generator_optimizer = None
        if self.moco is not None and self.moco.generator is not None:
            generator_optimizer = torch.optim.AdamW(self.moco.generator.parameters(), lr=config.generator_lr)
        return optimizer, scheduler, generator_optimizer

    def train(
        self,
        train_pairs: Sequence[tuple[str, str]],
        valid_pairs: Sequence[tuple[str, str]],
        pretrain_pairs: Sequence[tuple[str, str]] = (),
        on_step: Callable[[int, float], None] | None = None,
    ) -> list[dict]:
        """Optionally pre-train on `pretrain_pairs`, then train on `train_pairs`, validating each epoch."""
        config = self.config
        if not train_pairs or not valid_pairs:
            raise MedfaqError("training needs at least one training and one validation pair")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        config.save(self.out_dir)
        stages = []
        if config.pretrain_examples and len(pretrain_pairs) > config.pretrain_examples:
            pretrain_pairs = random.Random(config.seed).sample(list(pretrain_pairs), config.pretrain_examples)
        if pretrain_pairs:
            stages.append(
                ("pretrain", build_examples(pretrain_pairs, config, start_id=len(train_pairs)), config.pretrain_epochs)
            )
        stages.append(("main", build_examples(train_pairs, config), config.epochs))
        valid = list(valid_pairs)[: config.eval_examples or None]
        steps_per_epoch = {
            name: math.ceil(math.ceil(len(ex) / config.batch_size) / config.grad_accum) for name, ex, _ in stages
        }
        steps_total = sum(steps_per_epoch[name] * epochs for name, _, epochs in stages)
        self.build_moco(max(len(examples) for _, examples, _ in stages), steps_total)
        optimizer, scheduler, generator_optimizer = self._optimizers(steps_total)
        if self.resume:
            self._load_state(optimizer, scheduler, generator_optimizer)
        self.model.train()
        if self.moco is not None:
            self.moco.train()
        for stage, examples, epochs in stages:
            if self.stage == "main" and stage == "pretrain" and self.resume:
                continue  # the pre-training stage finished before the interruption
            self.stage = stage
            while self.epoch < epochs:
                stopped = self._run_epoch(stage, examples, optimizer, scheduler, generator_optimizer, on_step)
                if stopped:
                    return self.history
                finished = self._end_epoch(stage, valid, optimizer, scheduler, generator_optimizer)
                if finished:
                    return self.history
            if stage == "pretrain":
                self.stage, self.epoch, self.step_in_epoch = "main", 0, 0
        return self.history

    def _run_epoch(self, stage, examples, optimizer, scheduler, generator_optimizer, on_step) -> bool:
        """Train the rest of the current epoch; True when `max_steps` stopped the run (after a checkpoint)."""
        from tqdm.auto import tqdm

        config = self.config
        batches = epoch_batches(
            examples, config.batch_size, config.seed, self.epoch + (1000 if stage == "pretrain" else 0)
        )
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        start, cpu_start, seen = time.perf_counter(), time.process_time(), 0
        bar = tqdm(
            total=len(batches),
            initial=self.step_in_epoch,
            desc=f"{stage} epoch {self.epoch + 1}",
            dynamic_ncols=True,
            leave=False,
        )
        for batch_examples in batches[self.step_in_epoch :]:
            batch = self.collator(batch_examples).to(self.device)
            with autocast(config.precision, self.device):
                loss, parts, cosines = self.losses(batch)
            (loss / config.grad_accum).backward()
            for key, value in [*parts.items(), *(("cos_" + k, v) for k, v in cosines.items())]:
                if value is not None:
                    sums[key] = sums.get(key, 0.0) + value
                    counts[key] = counts.get(key, 0) + 1
            self.step_in_epoch += 1
            seen += len(batch_examples)
            bar.update(1)
            bar.set_postfix({k: f"{sums[k] / counts[k]:.3f}" for k in parts})
            if self.step_in_epoch % config.grad_accum == 0 or self.step_in_epoch == len(batches):
                self._optimizer_step(optimizer, scheduler, generator_optimizer)
                if on_step is not None:
                    on_step(self.global_step, parts["loss"])
                if config.save_every_steps and self.global_step % config.save_every_steps == 0:
                    self._save_last(optimizer, scheduler, generator_optimizer)
                if config.max_steps and self.global_step >= config.max_steps:
                    bar.close()
                    self._save_last(optimizer, scheduler, generator_optimizer)
                    return True
        bar.close()
        elapsed = time.perf_counter() - start
        self._epoch_stats = {f"train_{k}": sums[k] / counts[k] for k in sums}
        self._epoch_stats.update(
            train_seconds=elapsed,
            train_cpu_seconds=time.process_time() - cpu_start,
            examples_per_second=seen / elapsed if elapsed else 0.0,
        )
        return False

    def _optimizer_step(self, optimizer, scheduler, generator_optimizer) -> None:
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if generator_optimizer is not None:
            generator_optimizer.step()
            generator_optimizer.zero_grad(set_to_none=True)
        if self.moco is not None:
            self.moco.update(self.encoder)
        self.global_step += 1

    def _end_epoch(self, stage, valid, optimizer, scheduler, generator_optimizer) -> bool:
        """Validate, keep the best model, log, checkpoint; True when early stopping ends the run."""
        config = self.config
        start = time.perf_counter()
        score = None  # pre-training is not validated: only the main stage's epochs pick the model
        if stage == "main":
            predictions = self.generate([p[0] for p in valid], config.eval_beams, config.eval_max_length)
            score = rouge_l(predictions, [p[1] for p in valid])
        record = {
            "stage": stage,
            "epoch": self.epoch + 1,
            "step": self.global_step,
            "valid_rougeL": score,
            "valid_seconds": time.perf_counter() - start,
            **getattr(self, "_epoch_stats", {}),
        }
        self.epoch, self.step_in_epoch = self.epoch + 1, 0
        finished = False
        if stage == "main":
            if score > self.best_score:
                self.best_score, self.bad_epochs = score, 0
                self._save_model(self.out_dir)
                record["best"] = True
            else:
                self.bad_epochs += 1
                finished = self.bad_epochs >= config.patience
        self.history.append(record)
        logger.info("epoch %s", json.dumps(record))
        print(json.dumps(record), flush=True)
        (self.out_dir / HISTORY_FILE).write_text(json.dumps(self.history, indent=2) + "\n", encoding="utf-8")
        self._save_last(optimizer, scheduler, generator_optimizer)
        return finished

    def generate(self, texts: list[str], num_beams: int, max_length: int, batch_size: int = 32) -> list[str]:
        """Summaries of `texts` with the current model (eval mode inside, train mode restored after)."""
        from medfaq.summarizer.decoding import Decoding
        from medfaq.summarizer.generation import Summarizer

        summarizer = Summarizer(self.model, self.tokenizer, self.device, max_source_len=self.config.max_source_len)
        try:
            return summarizer.summarize(texts, Decoding(num_beams, max_length), batch_size)
        finally:
            self.model.train()

    # ----- checkpoints ----------------------------------------------------------------------------------------
    def _save_model(self, directory: Path, resumable: bool = False) -> None:
        """The model, tokenizer and config; with LoRA, the merged model (what every loader reads), or the adapter
        alone when `resumable` (what ``--resume`` continues from)."""
        directory.mkdir(parents=True, exist_ok=True)
        model = self.model
        if self.config.lora_rank and not resumable:
            model = copy.deepcopy(self.model).merge_and_unload()
        model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        self.config.save(directory)

    def _save_last(self, optimizer, scheduler, generator_optimizer) -> None:
        """Write `<out>/last` atomically: model, tokenizer, config and everything needed to continue exactly."""
        final = self.out_dir / LAST_DIR
        tmp = self.out_dir / (LAST_DIR + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self._save_model(tmp, resumable=True)
        numpy_state = np.random.get_state()
        state = {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "generator_optimizer": generator_optimizer.state_dict() if generator_optimizer is not None else None,
            "moco": self.moco.state_dict() if self.moco is not None else None,
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "numpy_rng": [numpy_state[0], torch.from_numpy(numpy_state[1].astype(np.int64)), *numpy_state[2:]],
            "progress": {
                "stage": self.stage,
                "epoch": self.epoch,
                "step_in_epoch": self.step_in_epoch,
                "global_step": self.global_step,
                "best_score": self.best_score,
                "bad_epochs": self.bad_epochs,
                "history": self.history,
            },
        }
        torch.save(state, tmp / STATE_FILE)
        old = self.out_dir / (LAST_DIR + ".old")
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)

    def _load_state(self, optimizer, scheduler, generator_optimizer) -> None:
        state = torch.load(self.out_dir / LAST_DIR / STATE_FILE, map_location=self.device, weights_only=True)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if generator_optimizer is not None:
            generator_optimizer.load_state_dict(state["generator_optimizer"])
        if self.moco is not None:
            self.moco.load_state_dict(state["moco"])
        torch.set_rng_state(state["torch_rng"].cpu())
        random.setstate(state["python_rng"])
        kind, keys, *rest = state["numpy_rng"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
        progress = state["progress"]
        self.stage, self.epoch, self.step_in_epoch = progress["stage"], progress["epoch"], progress["step_in_epoch"]
        self.global_step, self.best_score = progress["global_step"], progress["best_score"]
        self.bad_epochs, self.history = progress["bad_epochs"], progress["history"]
        logger.info("resumed %s at %s epoch %d step %d", self.out_dir, self.stage, self.epoch, self.global_step)


def with_lora(model, rank: int, adapter: Path | None = None):
    """`model` wrapped in rank-`rank` LoRA adapters of every linear layer but the LM head (alpha = 2 x rank, no
    dropout), all other weights frozen; `adapter`: continue from that saved adapter instead of a fresh one."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter is not None:
        return PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def train_summarizer(
    config: SummarizerTrainConfig,
    train_pairs: Sequence[tuple[str, str]],
    valid_pairs: Sequence[tuple[str, str]],
    out_dir: Path | str,
    resume: bool = False,
    pretrain_pairs: Sequence[tuple[str, str]] = (),
) -> list[dict]:
    """Train (or resume) one run; the best model ends up in `out_dir`. Returns the per-epoch history."""
    return SummarizerTrainer(config, out_dir, resume=resume).train(train_pairs, valid_pairs, pretrain_pairs)
