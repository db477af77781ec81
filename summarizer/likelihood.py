"""The summarizer as a ranker: how likely it finds each candidate FAQ question as the summary of a consumer question.

`SummaryLikelihood.score(question, candidates, prior_weight, per_token)` returns, per candidate,
log P(candidate | question) less `prior_weight` x log P(candidate | empty question), summed over the candidate's
tokens or averaged per token (`per_token`). The second term is the model's prior towards a question whatever the
consumer asked (generic questions such as "What are the treatments for X?"); subtracting it with weight 1 gives the
pointwise mutual information of question and candidate.

The candidates are scored in one batch that shares the question: a decoder-only model (Gemma) reads one packed
sequence, the prompt and then every candidate, each candidate seeing the prompt and itself only
(:func:`causal_logits`); an encoder-decoder encodes the question once and every candidate's decoder attends to that
one encoding. The tokens scored are the ones the trainer taught
(summarizer/training/collator.py): a decoder-only model's " " + question + EOS after the prompt, a seq2seq model's
target tokens (BERT2BERT: without the [CLS] its decoder starts from). Priors depend on the candidate alone and are
kept per text, so a bank's FAQs cost their prior once.

A decoder-only model predicts over a trimmed vocabulary (``vocabulary="bank"``, summarizer/vocabulary.py): the tokens
of the bank's FAQ questions (:meth:`SummaryLikelihood.keep_bank`, which the pipeline calls with its index's) and
of every candidate scored. Its softmax is the full softmax restricted to those tokens and renormalised; the question
is read whole. Gemma's 262,144-row output layer over every candidate token is most of the stage's arithmetic, and a
bank uses a few thousand of them. A newly kept token changes every score by the little probability its row carries,
so the kept set and the priors computed under it are renewed together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from medfaq.common.runtime import MedfaqError, cast_for_inference, quantize_linear
from medfaq.summarizer.modeling import (
    clean_question,
    is_causal_lm,
    load_backbone,
    prompt_ids,
    trained_summarizer,
)
from medfaq.summarizer.vocabulary import KeptRowsHead, TrimmedVocabulary

VOCABULARIES = ("bank", "full")  # the tokens a decoder-only model's likelihood normalises over

MAX_TARGET_TOKENS = 64
PRIOR_CACHE_SIZE = 200_000


@dataclass(frozen=True)
class TokenScores:
    """Summed log-probability of each candidate's tokens, and how many tokens each has."""

    log_prob: np.ndarray
    tokens: np.ndarray


class SummaryLikelihood:
    """Scores (question, candidate FAQ question) pairs with a trained summarizer (see the module docstring); the
    pipeline's ``likelihood`` stage. Thread-safe: one scoring at a time."""

    def __init__(
        self,
        model,
        tokenizer,
        max_source_len: int = 512,
        max_target_len: int = MAX_TARGET_TOKENS,
        name: str = "",
        vocabulary: str = "bank",
        quantized: bool = False,
    ) -> None:
        """`model` in the precision it is to score in (int8 when `quantized`)."""
        if vocabulary not in VOCABULARIES:
            raise MedfaqError(f"likelihood vocabulary must be one of {', '.join(VOCABULARIES)}, got {vocabulary!r}")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.causal = is_causal_lm(model)
        self.trims = self.causal and vocabulary == "bank"
        self.quantized = quantized
        self.precision = "int8" if quantized else "bf16" if model.dtype == torch.bfloat16 else "fp32"
        self._kept_ids: set[int] = set()
        self._vocabulary: TrimmedVocabulary | None = None
        self._head: KeptRowsHead | None = None
        self._kept_banks: set[str] = set()
        self.max_source_len, self.max_target_len = max_source_len, max_target_len
        self.name = name
        bert2bert = model.config.model_type == "encoder-decoder"
        self._strip_start = model.config.decoder_start_token_id if bert2bert else None
        self._priors: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    @classmethod
    def load(
        cls, model: str | Path, quantize: bool = False, vocabulary: str = "bank", precision: str = "fp32"
    ) -> SummaryLikelihood:
        """A trained summarizer directory (seq2seq or decoder-only), on the CPU; `quantize`: int8 linear layers
        (PyTorch dynamic quantisation); `vocabulary`: ``bank`` (trimmed, see the module docstring) or ``full``;
        `precision`: the weights and products in ``fp32``, ``bf16``, or ``auto`` (bf16 where this CPU measures it
        faster; log-probabilities are always taken in fp32)."""
        path, saved = trained_summarizer(model)
        network, tokenizer = load_backbone(path)
        if is_causal_lm(network):
            check_packed_scoring(network)
        if quantize:
            quantize_linear(network)
        else:
            cast_for_inference(network, precision)
        return cls(
            network,
            tokenizer,
            max_source_len=saved.get("max_source_len", 512),
            max_target_len=saved.get("max_target_len", MAX_TARGET_TOKENS),
            name=str(path),
            vocabulary=vocabulary,
            quantized=quantize,
        )

    def keep(self, texts: Iterable[str]) -> None:
        """Keep the target tokens of `texts` (a bank's FAQ questions) in the trimmed vocabulary. Nothing to do for an
        untrimmed stage."""
        if self.trims:
            with self._lock:
                self._keep_targets([self._target_ids(text) for text in texts])

    def keep_bank(self, bank: str, questions: Callable[[], Iterable[str]]) -> None:
        """:meth:`keep` a bank's `questions()` once per `bank` key (an index's directory and version): a bank kept
        already costs nothing, not even reading its questions."""
        if self.trims and bank not in self._kept_banks:
            self.keep(questions())
            self._kept_banks.add(bank)

    def _keep_targets(self, rows: Sequence[Sequence[int]]) -> None:
        new = {token for row in rows for token in row} - self._kept_ids
        if not new and self._vocabulary is not None:
            return
        self._kept_ids |= new
        self._vocabulary = TrimmedVocabulary(self.tokenizer, self._kept_ids)
        self._head = self._vocabulary.head(self.model)
        if self.quantized:
            self._head.quantize()
        self._priors.clear()  # computed under the old kept set

    def score(
        self, query: str, candidates: list[str], prior_weight: float = 0.0, per_token: bool = True
    ) -> list[float]:
        """The corrected log-likelihood of each candidate given `query` (see the module docstring), higher = a
        likelier summary."""
        if not candidates:
            return []
        with self._lock:
            given = self.token_scores(query, candidates)
            prior = self.prior_scores(candidates) if prior_weight else given  # weighed 0: no prior computed
        return combine(given, prior, prior_weight, per_token).tolist()

    def prior_scores(self, candidates: Sequence[str]) -> TokenScores:
        """log P(candidate | empty question) of each candidate, computed once per text."""
        if self.trims:  # a token newly kept renews the priors: before they are read
            self._keep_targets([self._target_ids(text) for text in candidates])
        missing = list(dict.fromkeys(text for text in candidates if text not in self._priors))
        if missing:
            if len(self._priors) + len(missing) > PRIOR_CACHE_SIZE:
                self._priors.clear()
            found = self.token_scores("", missing)
            self._priors.update(zip(missing, zip(found.log_prob.tolist(), found.tokens.tolist(), strict=True)))
        rows = [self._priors[text] for text in candidates]
        return TokenScores(np.array([r[0] for r in rows]), np.array([r[1] for r in rows]))

    def token_scores(self, query: str, candidates: Sequence[str]) -> TokenScores:
        """Summed log P(candidate tokens | query) and token counts, all candidates in one batch sharing `query`."""
        rows = [self._target_ids(text) for text in candidates]
        labels = targets = padded_targets(rows)
        with torch.inference_mode():
            if self.causal:
                prompt = torch.tensor([prompt_ids(self.tokenizer, query, self.max_source_len)[0]])
                with self._predicting(rows):
                    logits = causal_logits(self.model, prompt, labels)
                if self._vocabulary is not None:  # the logits are over the kept ids
                    targets = self._vocabulary.to_kept_targets(labels)
            else:
                encoded = self.tokenizer(
                    clean_question(query), max_length=self.max_source_len, truncation=True, return_tensors="pt"
                )
                logits = seq2seq_logits(self.model, encoded, labels)
            total = summed_log_probs(logits, targets)
        return TokenScores(total.double().numpy(), (labels != -100).sum(dim=1).numpy())

    def _predicting(self, rows: Sequence[Sequence[int]]):
        """The model predicting over the kept tokens (those of `rows` kept too) when trimmed, else as it is."""
        if not self.trims:
            return nullcontext()
        self._keep_targets(rows)
        return self._vocabulary.predicting(self.model, self._head)

    def _target_ids(self, text: str) -> list[int]:
        return target_ids(self.tokenizer, text, self.max_target_len, self.causal, self._strip_start)


def target_ids(tokenizer, text: str, max_len: int, causal: bool, strip_start: int | None = None) -> list[int]:
    """The tokens a summarizer learns and is scored on for the FAQ question `text`: a decoder-only model's
    " " + question + EOS after its prompt; a seq2seq model's target tokens, without a leading `strip_start` (the
    [CLS] a BERT2BERT decoder starts from)."""
    if causal:
        ids = tokenizer(" " + clean_question(text), max_length=max_len, truncation=True, add_special_tokens=False)
        return [*ids["input_ids"], tokenizer.eos_token_id]
    ids = tokenizer(text, max_length=max_len, truncation=True)["input_ids"]
    return ids[1:] if strip_start is not None and ids[:1] == [strip_start] else ids


def padded_targets(rows: Sequence[Sequence[int]]) -> torch.Tensor:
    """Target token rows right-padded with -100 into one (N, T) tensor."""
    width = max(len(row) for row in rows)
    return torch.tensor([[*row, *[-100] * (width - len(row))] for row in rows], dtype=torch.long)


def causal_logits(model, prompt: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A decoder-only model's logits predicting each target token of `labels` (N, T; -100-padded) after the one
    `prompt` (1, P), in one forward pass over one packed sequence: the prompt, then every candidate's tokens but its
    last, each candidate attending to the prompt and to its own earlier tokens only, at the positions it would have
    right after the prompt (see :func:`packed_attention`). No candidate pays for another's padding or for a copy of
    the prompt's cache. Differentiable outside inference mode."""
    device, width = labels.device, prompt.size(1)
    lengths = (labels != -100).sum(dim=1)
    steps = torch.arange(labels.size(1), device=device)[None, :]
    inputs = labels[:, :-1].clamp(min=0)
    continued = steps[:, :-1] < (lengths[:, None] - 1)  # every real token but the last: what the candidate reads
    candidate = torch.arange(len(labels), device=device)[:, None].expand_as(inputs)[continued]
    offset = steps[:, :-1].expand_as(inputs)[continued]
    packed = torch.cat([prompt[0], inputs[continued]])[None, :]
    owner = torch.cat([prompt.new_full((width,), -1), candidate])
    positions = torch.cat([torch.arange(width, device=device), width + offset])
    logits = model(
        input_ids=packed,
        position_ids=positions[None, :],
        attention_mask=packed_attention(model.config, owner, positions),
        use_cache=False,
        logits_to_keep=torch.arange(width - 1, packed.size(1), device=device),  # the prompt's last token onwards
    ).logits[0]
    # kept row 0 predicts every candidate's first token; candidate i's token j >= 1 is predicted at its token j - 1,
    # kept row 1 + (i's start among the packed candidate tokens) + j - 1
    starts = torch.cumsum(lengths - 1, dim=0) - (lengths - 1)
    where = torch.where((steps >= 1) & (steps < lengths[:, None]), starts[:, None] + steps, 0)
    return logits[where]


def check_packed_scoring(model) -> None:
    """Refuse a decoder-only `model` whose forward pass does not honour :func:`causal_logits`' packed attention mask
    (one that builds its own mask would let candidates see each other): its packed logits for two short candidates
    must equal one plain forward pass per candidate. Run on the fp32 weights, before any cast."""
    device = next(model.parameters()).device
    prompt = torch.tensor([[5, 6, 7, 8]], device=device)
    labels = torch.tensor([[9, 10, 11], [12, 13, -100]], device=device)
    training = model.training
    model.eval()  # every pass without dropout
    try:
        with torch.inference_mode():
            packed = causal_logits(model, prompt, labels)
            for row, target in enumerate(labels):
                tokens = int((target != -100).sum())
                alone = model(input_ids=torch.cat([prompt[0], target[: tokens - 1]])[None]).logits
                if not torch.allclose(packed[row, :tokens], alone[0, prompt.size(1) - 1 :], rtol=1e-4, atol=1e-3):
                    raise MedfaqError(
                        f"{model.config.model_type}: its forward pass does not take a packed attention mask, so the"
                        " likelihood stage cannot score its candidates in one batch"
                    )
    finally:
        model.train(training)


def packed_attention(config, owner: torch.Tensor, positions: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
    """The (1, 1, L, L) boolean attention mask of a packed sequence whose token i belongs to candidate `owner[i]`
    (-1: the shared prompt) at position `positions[i]`: a token sees the prompt and its own candidate, causally by
    position; a sliding-window layer only what lies less than its window behind. Models with several kinds of layer
    (Gemma 3) take one mask per kind; a model with one kind and a window (Mistral) slides in every layer."""
    same = (owner[None, :] == -1) | (owner[None, :] == owner[:, None])
    mask = (same & (positions[None, :] <= positions[:, None]))[None, None]
    window = getattr(config, "sliding_window", None)
    sliding = mask & (positions[:, None] - positions[None, :] < window)[None, None] if window else mask
    kinds = getattr(config, "layer_types", None)
    if not kinds:
        return sliding
    return {kind: sliding if kind == "sliding_attention" else mask for kind in set(kinds)}


def seq2seq_logits(model, encoded: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
    """An encoder-decoder's logits predicting each target token of `labels` (N, T; -100-padded): the one source
    `encoded` (1, S) is encoded once and every candidate's decoder reads it. Differentiable outside inference mode."""
    hidden = model.get_encoder()(**encoded).last_hidden_state
    rows = len(labels)
    return model(
        encoder_outputs=(hidden.expand(rows, -1, -1).contiguous(),),
        attention_mask=encoded["attention_mask"].expand(rows, -1),
        decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels),
    ).logits


def summed_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each row's summed log-probability of its target tokens (`labels` -100-padded), in fp32."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    picked = log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * (labels != -100)).sum(dim=1)


def combine(given: TokenScores, prior: TokenScores, prior_weight: float, per_token: bool) -> np.ndarray:
    """log P(candidate | question) - `prior_weight` x log P(candidate | empty question), summed over the candidate's
    tokens, or per token with `per_token`."""
    scores = given.log_prob - prior_weight * prior.log_prob
    return scores / np.maximum(given.tokens, 1) if per_token else scores
