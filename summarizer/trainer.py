"""ECL training: label-smoothed cross-entropy + α·L_scl (queue negatives) + β·L_hcl (entity hard negatives).

One trainer runs every variant (`VARIANTS`): ``ecl``, ``mle`` (= ECL−s−h), ``ecl-s`` (no simple negatives), ``ecl-h``
(no hard negatives), ``qfcl`` (focus hard negatives and a decoder anchor: L = L_ce + β·(L_ctrC + L_ctrG), each
L_ctr = α·L_scl + L_hcl, with α = 1, β = 0.5) and ``learned`` (queue negatives plus K negatives made by a small
generator trained adversarially to maximise the contrastive loss, with a diversity loss).

The output directory is a ready summarizer (best checkpoint by validation ROUGE-L: model in safetensors, tokenizer,
``train_config.json``, ``history.json``); ``<out>/last`` holds the resume checkpoint (model, optimizer, scheduler,
key encoder, queue, RNG states, epoch and step).
"""

from __future__ import annotations

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

from index.runtime import MedfaqError, choose_device, seed_everything
from summarizer.contrastive import MoCo, diversity_loss, info_nce, masked_mean, mean_cosine
from summarizer.modeling import load_backbone

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
    beta: float = 1.0  # weight of L_hcl (hard or learned negatives); QFCL: weight of L_ctrC and L_ctrG
    label_smoothing: float = 0.1
    momentum: float = 0.999
    queue_size: int = 4096
    temperature: float = 0.07
    n_hard_negatives: int = 4
    n_learned_negatives: int = 4
    diversity_weight: float = 1.0
    generator_lr: float = 1e-4
    lr: float = 3e-4
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
    pretrain: list[str] = field(default_factory=list)  # CHQ->FAQ data sets trained on before the main data
    pretrain_epochs: int = 1
    pretrain_examples: int = 0  # sample this many pre-training pairs (0: all)
    device: str | None = None
    threads: int = 0  # torch threads (0: torch's default)
    save_every_steps: int = 0  # also checkpoint every N optimizer steps (0: at epoch ends only)
    max_steps: int = 0  # stop (with a checkpoint) after N optimizer steps in total (0: no limit)

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise MedfaqError(f"unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        if self.batch_size < 1 or self.grad_accum < 1 or self.epochs < 1:
            raise MedfaqError("batch size, gradient accumulation and epochs must be at least 1")

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
    def load(cls, directory: Path) -> SummarizerTrainConfig:
        return cls(**json.loads((Path(directory) / CONFIG_FILE).read_text(encoding="utf-8")))


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


def preset_config(preset: str = "quick", variant: str = "ecl", **overrides) -> SummarizerTrainConfig:
    """The preset's config for `variant`, with every override that is not None applied."""
    if preset not in PRESETS:
        raise MedfaqError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    values = {"preset": preset, "variant": variant, **PRESETS[preset]}
    if variant == "qfcl":
        values.update(QFCL_DEFAULTS)
    values.update({key: value for key, value in overrides.items() if value is not None})
    unknown = set(values) - {f.name for f in dataclasses.fields(SummarizerTrainConfig)}
    if unknown:
        raise MedfaqError(f"unknown training options: {', '.join(sorted(unknown))}")
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
    ids: torch.Tensor
    source: dict[str, torch.Tensor]
    target: dict[str, torch.Tensor]
    labels: torch.Tensor
    negatives: dict[str, torch.Tensor]  # (B·n_h, T) flattened groups
    negative_mask: torch.Tensor  # (B, n_h): which slots of each example's group hold a negative

    def to(self, device: str) -> Batch:
        def move(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {key: value.to(device) for key, value in tensors.items()}

        return Batch(
            self.ids.to(device),
            move(self.source),
            move(self.target),
            self.labels.to(device),
            move(self.negatives),
            self.negative_mask.to(device),
        )


class Collator:
    """Tokenizes examples; hard negatives are padded to `n_hard` slots per example with a mask."""

    def __init__(self, tokenizer, max_source_len: int, max_target_len: int, n_hard: int):
        self.tokenizer, self.n_hard = tokenizer, n_hard
        self.max_source_len, self.max_target_len = max_source_len, max_target_len

    def _tokenize(self, texts: list[str], max_len: int) -> dict[str, torch.Tensor]:
        encoded = self.tokenizer(texts, max_length=max_len, truncation=True, padding=True, return_tensors="pt")
        return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}

    def __call__(self, examples: Sequence[Example]) -> Batch:
        source = self._tokenize([e.chq for e in examples], self.max_source_len)
        target = self._tokenize([e.faq for e in examples], self.max_target_len)
        labels = target["input_ids"].masked_fill(target["attention_mask"] == 0, -100)
        groups = [list(e.negatives[: self.n_hard]) for e in examples]
        mask = torch.tensor([[slot < len(g) for slot in range(self.n_hard)] for g in groups], dtype=torch.bool)
        flat = [g[slot] if slot < len(g) else "" for g in groups for slot in range(self.n_hard)]
        negatives = (
            self._tokenize(flat, self.max_target_len)
            if flat
            else {
                "input_ids": torch.zeros(0, 1, dtype=torch.long),
                "attention_mask": torch.zeros(0, 1, dtype=torch.long),
            }
        )
        ids = torch.tensor([e.id for e in examples], dtype=torch.long)
        return Batch(ids, source, target, labels, negatives, mask.view(len(examples), self.n_hard))


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
    """Attach each pair's hard negatives (entity swaps for ECL, focus swaps for QFCL) as its own group."""
    chqs, faqs = [p[0] for p in pairs], [p[1] for p in pairs]
    if not config.uses_hard or config.n_hard_negatives < 1:
        groups: list[list[str]] = [[] for _ in pairs]
    elif config.variant == "qfcl":
        from summarizer.negatives import focus_hard_negatives

        groups = focus_hard_negatives(chqs, faqs, config.n_hard_negatives, config.seed)
    else:
        from summarizer.negatives import entity_hard_negatives

        groups = entity_hard_negatives(faqs, config.n_hard_negatives, config.seed)
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
        self.model, self.tokenizer = load_backbone(last if resume else config.backbone)
        self.model.to(self.device)
        self.encoder = self.model.get_encoder()
        self.moco = None
        if config.uses_moco:
            dim = self.encoder.config.hidden_size if hasattr(self.encoder, "config") else self.model.config.d_model
            learned = config.n_learned_negatives if config.variant == "learned" else 0
            self.moco = MoCo(self.encoder, dim, config.queue_size, config.momentum, config.temperature, learned)
            self.moco.to(self.device)
        self.collator = Collator(
            self.tokenizer,
            config.max_source_len,
            config.max_target_len,
            config.n_hard_negatives if config.uses_hard else 0,
        )
        self.history: list[dict] = []
        self.best_score = -math.inf
        self.bad_epochs = 0
        self.epoch = 0  # epochs finished (of the current stage)
        self.step_in_epoch = 0  # micro-batches finished in the current epoch
        self.global_step = 0  # optimizer steps
        self.stage = "main"

    # ----- one step -------------------------------------------------------------------------------------------
    def losses(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float], dict[str, float | None]]:
        """Total loss of one micro-batch, its parts, and the anchor/negative cosines for the history."""
        config, model = self.config, self.model
        encoder_out = self.encoder(**batch.source)
        decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch.labels)
        out = model(
            attention_mask=batch.source["attention_mask"],
            encoder_outputs=encoder_out,
            decoder_input_ids=decoder_input_ids,
            output_hidden_states=config.variant == "qfcl",
        )
        logits = out.logits
        ce = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)),
            batch.labels.reshape(-1),
            ignore_index=-100,
            label_smoothing=config.label_smoothing,
        )
        parts = {"ce": float(ce.detach())}
        cosines: dict[str, float | None] = {}
        if self.moco is None:
            return ce, parts, cosines
        tau = config.temperature
        anchor = masked_mean(encoder_out.last_hidden_state, batch.source["attention_mask"])
        positive = self.moco.keys(**batch.target)
        anchors = {"enc": anchor}
        if config.variant == "qfcl":
            decoder_mask = (batch.labels != -100).long()
            anchors["dec"] = masked_mean(out.decoder_hidden_states[-1], decoder_mask)
        total = ce
        queue_keys = queue_mask = hard_keys = None
        if config.uses_queue:
            queue_keys, queue_mask = self.moco.queue.negatives_for(batch.ids)
            cosines["simple"] = mean_cosine(anchor.detach(), queue_keys, queue_mask)
        if config.uses_hard:
            hard_keys = self.moco.grouped_keys(
                batch.negatives["input_ids"], batch.negatives["attention_mask"], batch.negative_mask
            )
            cosines["hard"] = mean_cosine(anchor.detach(), hard_keys, batch.negative_mask)
        for name, vector in anchors.items():
            suffix = "" if name == "enc" else "_dec"
            contrast = 0.0
            if queue_keys is not None:
                scl = info_nce(vector, positive, queue_keys, queue_mask, tau)
                parts["scl" + suffix] = float(scl.detach())
                contrast = contrast + config.alpha * scl
            if hard_keys is not None:
                hcl = info_nce(vector, positive, hard_keys, batch.negative_mask, tau)
                parts["hcl" + suffix] = float(hcl.detach())
                contrast = contrast + (1.0 if config.variant == "qfcl" else config.beta) * hcl
            total = total + (config.beta * contrast if config.variant == "qfcl" else contrast)
        if self.moco.generator is not None:
            generated = self.moco.generator(positive)
            lcl = info_nce(anchor, positive, generated.detach(), None, tau)
            adversary = -info_nce(anchor.detach(), positive, generated, None, tau)
            diversity = diversity_loss(generated)
            parts.update(lcl=float(lcl.detach()), diversity=float(diversity.detach()))
            cosines["learned"] = mean_cosine(
                anchor.detach(),
                generated.detach(),
                torch.ones(generated.shape[:2], dtype=torch.bool, device=generated.device),
            )
            # the generator's parameters only see `adversary + diversity`; the model only sees `lcl`
            total = total + config.beta * lcl + adversary + config.diversity_weight * diversity
        if config.uses_queue:
            self.moco.queue.enqueue(positive, batch.ids)
        return total, parts, cosines

    # ----- the loop -------------------------------------------------------------------------------------------
    def _optimizers(self, steps_total: int):
        from transformers import get_linear_schedule_with_warmup

        config = self.config
        decay, no_decay = [], []
        for name, param in self.model.named_parameters():
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
                    on_step(self.global_step, float(loss.detach()))
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
        from summarizer.generation import Summarizer

        summarizer = Summarizer(self.model, self.tokenizer, self.device, max_source_len=self.config.max_source_len)
        try:
            return summarizer.summarize(texts, num_beams=num_beams, max_length=max_length, batch_size=batch_size)
        finally:
            self.model.train()

    # ----- checkpoints ----------------------------------------------------------------------------------------
    def _save_model(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        self.config.save(directory)

    def _save_last(self, optimizer, scheduler, generator_optimizer) -> None:
        """Write `<out>/last` atomically: model, tokenizer, config and everything needed to continue exactly."""
        final = self.out_dir / LAST_DIR
        tmp = self.out_dir / (LAST_DIR + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self._save_model(tmp)
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
