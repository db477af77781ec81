"""ECL training: label-smoothed cross-entropy + α·L_scl (queue negatives) + β·L_hcl (entity hard negatives).

One trainer runs every variant (`config.VARIANTS`): ``ecl``, ``mle`` (= ECL−s−h), ``ecl-s`` (no simple negatives),
``ecl-h`` (no hard negatives), ``qfcl`` (focus hard negatives and a decoder anchor: L = L_ce + ½(α·L_scl + β·L_hcl)_enc
+ ½(α·L_scl + β·L_hcl)_dec, with α = 1, β = 0.5), ``learned`` (queue negatives plus K negatives made by a small
generator trained adversarially to maximise the contrastive loss at its own temperature, with a diversity loss) and
``rank`` (no key encoder: the hard negatives compete with the reference FAQ on the sequence log-likelihood itself,
the score the pipeline's likelihood stage reads; see `SummarizerTrainConfig.rank_weight`).

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
import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from medfaq.common.runtime import (
    CHECKPOINT_DIR,
    CHECKPOINT_STATE,
    UNFINISHED_FILE,
    MedfaqError,
    autocast,
    check_out_dir,
    choose_device,
    release_freed_memory,
    resolve_precision,
    resumable_run,
    seed_everything,
)
from medfaq.summarizer.likelihood import (
    causal_logits,
    check_packed_scoring,
    seq2seq_logits,
    summed_log_probs,
    target_ids,
)
from medfaq.summarizer.modeling import is_causal_lm, load_backbone, prompt_ids
from medfaq.summarizer.training.collator import Batch, Collator
from medfaq.summarizer.training.config import RETRIEVAL_NEGATIVES_FILE, SummarizerTrainConfig
from medfaq.summarizer.training.contrastive import MoCo, diversity_loss, info_nce, masked_mean, mean_cosine
from medfaq.summarizer.training.examples import Example, build_examples, epoch_batches
from medfaq.summarizer.vocabulary import TrimmedVocabulary

logger = logging.getLogger("medfaq")

HISTORY_FILE = "history.json"
STATE_FILE = CHECKPOINT_STATE
LAST_DIR = CHECKPOINT_DIR


def _stopped_before_checkpoint(out_dir: Path) -> bool:
    """Whether `out_dir` holds only a run of this trainer that stopped before its first checkpoint (its unfinished
    mark, no state to resume): a new run may start there from the beginning."""
    return (out_dir / UNFINISHED_FILE).is_file() and not resumable_run(out_dir)


def check_run_dir(out_dir: Path | str, resume: bool = False) -> Path:
    """`out_dir` where a run can train into it, else a one-line error: a place that cannot be written
    (:func:`common.runtime.check_out_dir`), a directory in use (unless it holds only a run that stopped before its
    first checkpoint), or, with `resume`, one without a checkpoint to resume. Commands call it before any work."""
    out_dir = check_out_dir(out_dir)
    if resume and not (out_dir / LAST_DIR / STATE_FILE).is_file():
        raise MedfaqError(f"nothing to resume in {out_dir} (no {LAST_DIR}/{STATE_FILE})")
    if not resume and out_dir.is_dir() and any(out_dir.iterdir()) and not _stopped_before_checkpoint(out_dir):
        raise MedfaqError(f"output directory {out_dir} is not empty; pass --resume or another --out")
    return out_dir


def sized_queue(n_examples: int, batch_size: int, limit: int = 4096) -> int:
    """Queue length for a data set: half an epoch of FAQ keys (no stale copies of one FAQ), at most `limit`."""
    return max(batch_size, min(limit, n_examples // 2))


def sized_momentum(steps_total: int) -> float:
    """Key-encoder momentum for a run of `steps_total` optimizer steps: 1 − 10/steps, within [0.9, 0.999], so the
    key encoder follows the query encoder within about a tenth of the run (0.999 suits 10,000+ steps)."""
    return min(0.999, max(0.9, 1.0 - 10.0 / max(steps_total, 1)))


def rouge_l(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Mean stemmed ROUGE-L F1 in percent."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    scores = [scorer.score(ref, pred)["rougeL"].fmeasure for pred, ref in zip(predictions, references, strict=True)]
    return 100.0 * float(np.mean(scores)) if scores else 0.0


class SummarizerTrainer:
    """Trains one variant on CHQ→FAQ pairs; `train()` returns the history (one dict per epoch)."""

    def __init__(self, config: SummarizerTrainConfig, out_dir: Path | str, resume: bool = False):
        self.config, self.out_dir = config, check_run_dir(out_dir, resume)
        last = self.out_dir / LAST_DIR
        self.resume = resume
        if config.threads > 0:
            torch.set_num_threads(config.threads)
        seed_everything(config.seed)
        self.device = choose_device(config.device)
        config.precision = resolve_precision(config.precision, self.device)
        # with LoRA, last/ holds the adapter only: the run continues from the backbone plus that adapter
        self.network, self.tokenizer = load_backbone(last if resume and not config.lora_rank else config.backbone)
        self.causal = is_causal_lm(self.network)
        if self.causal and config.variant == "rank":
            check_packed_scoring(self.network)  # L_rank scores candidates as the likelihood stage does
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
            config.hard_slots,
            causal=self.causal,
            strip_start=self.network.config.decoder_start_token_id if bert2bert else None,
            rank_targets=config.variant == "rank",
        )
        self._empty_source = self._source_for("") if config.variant == "rank" else None  # the prior's: no question
        self.rank_vocabulary: TrimmedVocabulary | None = None  # set by `keep_rank_vocabulary`
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
            objective = ce
            if config.variant == "rank":
                rank = self._rank_loss(batch)
                parts["rank"] = float(rank.detach())
                objective = ce + config.rank_weight * rank
            parts["loss"] = float(objective.detach())
            return objective, parts, cosines
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

    def _source_for(self, text: str) -> torch.Tensor | dict[str, torch.Tensor]:
        """The model's input for the question `text` alone: a decoder-only model's prompt ids (1, P), a seq2seq
        model's encoder inputs."""
        if self.causal:
            prompt = prompt_ids(self.tokenizer, text, self.config.max_source_len)[0]
            return torch.tensor([prompt], device=self.device)
        encoded = self.tokenizer(text, max_length=self.config.max_source_len, truncation=True, return_tensors="pt")
        return {key: value.to(self.device) for key, value in encoded.items()}

    def _row_source(self, batch: Batch, row: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """Example `row`'s CHQ input, unpadded (decoder-only: the prompt before its first target token)."""
        if self.causal:
            length = int((batch.labels[row] != -100).nonzero()[0])
            return batch.source["input_ids"][row : row + 1, :length]
        length = int(batch.source["attention_mask"][row].sum())
        return {key: value[row : row + 1, :length] for key, value in batch.source.items()}

    def keep_rank_vocabulary(self, examples: Sequence[Example]) -> None:
        """Variant rank on a decoder-only model: L_rank's softmax over the tokens of the examples' FAQs and negatives
        alone, as the likelihood stage's trimmed vocabulary (summarizer/likelihood.py) normalises over its bank's."""
        if self.config.variant != "rank" or not self.causal:
            return
        texts = {text for example in examples for text in (example.faq, *example.negatives)}
        max_len = self.config.max_target_len
        self.rank_vocabulary = TrimmedVocabulary(
            self.tokenizer, {token for text in texts for token in target_ids(self.tokenizer, text, max_len, True)}
        )

    def _summed_log_probs(self, source, labels: torch.Tensor) -> torch.Tensor:
        """log P(each row of `labels` | `source`), the source read once and shared, as the likelihood stage reads it."""
        if self.causal and self.rank_vocabulary is not None:
            kept = self.rank_vocabulary
            with kept.predicting(self.network, kept.head(self.network, differentiable=True)):
                logits = causal_logits(self.model, source, labels)
            labels = kept.to_kept_targets(labels)
        elif self.causal:
            logits = causal_logits(self.model, source, labels)
        else:
            logits = seq2seq_logits(self.model, source, labels)
        return summed_log_probs(logits, labels)

    def _rank_loss(self, batch: Batch) -> torch.Tensor:
        """L_rank (variant rank, see the config): for each example with a hard negative, the cross-entropy of its
        reference FAQ (candidate 0) among its candidates, scored log P(c | CHQ) - rank_prior x log P(c | no CHQ)."""
        config, losses = self.config, []
        for row in range(batch.ids.size(0)):
            valid = torch.cat([batch.negative_mask.new_ones(1), batch.negative_mask[row]])
            if int(valid.sum()) < 2:
                continue
            labels = batch.candidates[row][valid]
            labels = labels[:, : int((labels != -100).sum(dim=1).max())]
            scores = self._summed_log_probs(self._row_source(batch, row), labels)
            if config.rank_prior:
                scores = scores - config.rank_prior * self._summed_log_probs(self._empty_source, labels)
            losses.append(-torch.log_softmax(scores / config.rank_temperature, dim=0)[0])
        return torch.stack(losses).mean() if losses else torch.zeros((), device=self.device)

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
        retrieval_negatives: Sequence[dict] = (),
    ) -> list[dict]:
        """Optionally pre-train on `pretrain_pairs`, then train on `train_pairs`, validating each epoch;
        `retrieval_negatives` (``{"chq", "negatives"}`` rows) are saved beside the model and read as the CHQs'
        retrieval negatives."""
        config = self.config
        if not train_pairs or not valid_pairs:
            raise MedfaqError("training needs at least one training and one validation pair")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / UNFINISHED_FILE).touch()  # until the run ends: `medfaq setup` resumes it, never uses it
        if retrieval_negatives:
            path = self.out_dir / RETRIEVAL_NEGATIVES_FILE
            path.write_text("".join(json.dumps(row) + "\n" for row in retrieval_negatives), encoding="utf-8")
            config.retrieval_negatives = str(path)
        config.save(self.out_dir)
        stages = []
        if config.pretrain_examples and len(pretrain_pairs) > config.pretrain_examples:
            pretrain_pairs = random.Random(config.seed).sample(list(pretrain_pairs), config.pretrain_examples)
        if pretrain_pairs:
            stages.append(
                ("pretrain", build_examples(pretrain_pairs, config, start_id=len(train_pairs)), config.pretrain_epochs)
            )
        stages.append(("main", build_examples(train_pairs, config), config.epochs))
        self.keep_rank_vocabulary([example for _, examples, _ in stages for example in examples])
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
        if not self._run_stages(stages, valid, optimizer, scheduler, generator_optimizer, on_step):
            (self.out_dir / UNFINISHED_FILE).unlink()
        return self.history

    def _run_stages(self, stages, valid, optimizer, scheduler, generator_optimizer, on_step) -> bool:
        """Train each stage's remaining epochs; True when `max_steps` stopped the run before its end."""
        for stage, examples, epochs in stages:
            if self.stage == "main" and stage == "pretrain" and self.resume:
                continue  # the pre-training stage finished before the interruption
            self.stage = stage
            while self.epoch < epochs:
                if self._run_epoch(stage, examples, optimizer, scheduler, generator_optimizer, on_step):
                    return True
                if self._end_epoch(stage, valid, optimizer, scheduler, generator_optimizer):
                    return False  # stopped early: no gain for `patience` epochs
            if stage == "pretrain":
                self.stage, self.epoch, self.step_in_epoch = "main", 0, 0
        return False

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
        release_freed_memory()
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
