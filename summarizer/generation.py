"""Generation with a trained summarizer: batched greedy or beam search with the KV cache, inputs sorted by length;
optionally context-aware decoding (`ContextGuidance`) and the minimum Bayes risk choice among the best beams
(`consensus`).

Seq2seq models read the CHQ; decoder-only models read the cleaned CHQ + separator (left-padded) and continue it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from medfaq.common.model_kinds import QUESTION_WRITER, SUMMARIZER
from medfaq.common.runtime import MedfaqError, choose_device, quantize_linear
from medfaq.summarizer.decoding import GREEDY, Decoding
from medfaq.summarizer.modeling import (
    TRAIN_CONFIG_FILE,
    backbone_is_causal,
    cache_argument,
    is_causal_lm,
    load_backbone,
    load_tokenizer,
    prompt_ids,
    trained_summarizer,
)
from medfaq.summarizer.vocabulary import TrimmedVocabulary

CONFIG_FILE = TRAIN_CONFIG_FILE
INT8_BACKENDS = ("auto", "ctranslate2", "torch")
PLAUSIBILITY = 0.1


def generate_candidates(
    model,
    tokenizer,
    texts: Sequence[str],
    decoding: Decoding = GREEDY,
    batch_size: int = 16,
    max_source_len: int = 512,
    device: str = "cpu",
    progress: bool = True,
    vocabulary: TrimmedVocabulary | None = None,
) -> list[list[str]]:
    """The `decoding.mbr` best beams for each of `texts`, best first, in input order; batches hold inputs of similar
    length to waste little padding. `vocabulary`: a decoder-only model reads and predicts only those tokens (it
    must be applied to the model: :meth:`TrimmedVocabulary.applied`)."""
    from tqdm.auto import tqdm
    from transformers import LogitsProcessorList

    num_return, guidance = decoding.mbr, decoding.guidance
    causal = is_causal_lm(model)
    if guidance and not causal:
        raise MedfaqError("context-aware decoding (guidance) needs a decoder-only summarizer")
    empty_prompt = prompt_ids(tokenizer, "", max_source_len)[0] if guidance else []
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
    outputs: list[list[str]] = [[] for _ in texts]
    with torch.inference_mode():
        for start in tqdm(range(0, len(order), batch_size), desc="summarize", disable=not progress, leave=False):
            chunk = order[start : start + batch_size]
            if causal:
                encoded = left_padded([prompt_ids(tokenizer, texts[i], max_source_len)[0] for i in chunk], tokenizer)
            else:
                encoded = tokenizer(
                    [texts[i] for i in chunk],
                    max_length=max_source_len,
                    truncation=True,
                    padding=True,
                    return_tensors="pt",
                )
            special = {}
            if vocabulary is not None:
                encoded["input_ids"] = vocabulary.to_kept(encoded["input_ids"])
                ends = torch.tensor([tokenizer.eos_token_id, tokenizer.pad_token_id])
                special = dict(zip(("eos_token_id", "pad_token_id"), vocabulary.to_kept(ends).tolist(), strict=True))
            encoded = {key: value.to(device) for key, value in encoded.items()}
            width = encoded["input_ids"].size(1)
            guide = [ContextGuidance(model, empty_prompt, width, guidance)] if guidance else []
            generated = model.generate(
                input_ids=encoded["input_ids"],
                attention_mask=encoded["attention_mask"],
                num_beams=decoding.width,
                num_return_sequences=num_return,
                use_cache=True,
                max_new_tokens=decoding.max_length,
                early_stopping=decoding.width > 1,
                **sampling_arguments(decoding),
                **special,
                length_penalty=decoding.length_penalty,
                logits_processor=LogitsProcessorList(guide),
            )
            if causal:
                generated = generated[:, width:]
            if vocabulary is not None:
                generated = vocabulary.to_full(generated.cpu())
            decoded = tokenizer.batch_decode(generated, skip_special_tokens=True)
            for row, i in enumerate(chunk):
                outputs[i] = [" ".join(text.split()) for text in decoded[row * num_return : (row + 1) * num_return]]
    return outputs


def sampling_arguments(decoding: Decoding) -> dict:
    """`generate`'s sampling arguments: nucleus sampling when `decoding.sample`, else none (search)."""
    if not decoding.sample:
        return {"do_sample": False}
    return {"do_sample": True, "top_p": decoding.top_p, "temperature": decoding.temperature}


class ContextGuidance:
    """Context-aware decoding (Shi et al., NAACL 2024) as a logits processor: next-token scores
    (1 + w) log p(y | CHQ) - w log p(y | no CHQ), which lowers what the model would ask whatever the CHQ said (its
    most frequent question type) and raises what this CHQ makes likely. Only tokens whose probability given the CHQ
    is at least `PLAUSIBILITY` times the best token's stay open (the plausibility constraint of contrastive decoding,
    Li et al., ACL 2023), so the ratio cannot promote a token the CHQ itself makes unlikely.

    The context-free model (the prompt of an empty CHQ) runs beside the search with its own KV cache, whose rows
    follow the beams: each row's cache is the one of the row that held its prefix at the previous step."""

    def __init__(self, model, empty_prompt: list[int], prompt_width: int, weight: float, tokens: int = 0):
        """`tokens` > 0: guide only the first `tokens` generated tokens (where the question type is chosen)."""
        self.model, self.weight, self.prompt_width, self.tokens = model, weight, prompt_width, tokens
        self.empty_prompt = torch.tensor([empty_prompt])
        self.cache_argument = cache_argument(model)
        self.cache = None
        self.rows: dict[tuple[int, ...], int] = {}

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        from transformers import DynamicCache

        generated = input_ids[:, self.prompt_width :]
        if self.tokens and generated.size(1) >= self.tokens:
            return torch.log_softmax(scores.float(), dim=-1)
        if self.cache is None:
            self.cache = DynamicCache(config=self.model.config)
            step_ids = self.empty_prompt.to(input_ids.device).expand(len(input_ids), -1)
        else:
            previous = [self.rows[tuple(row[:-1])] for row in generated.tolist()]
            self.cache.reorder_cache(torch.tensor(previous, device=input_ids.device))
            step_ids = generated[:, -1:]
        output = self.model(input_ids=step_ids, use_cache=True, logits_to_keep=1, **{self.cache_argument: self.cache})
        self.rows = {tuple(row): index for index, row in enumerate(generated.tolist())}
        conditional = torch.log_softmax(scores.float(), dim=-1)
        context_free = torch.log_softmax(output.logits[:, -1].float(), dim=-1)
        plausible = conditional >= conditional.max(dim=-1, keepdim=True).values + math.log(PLAUSIBILITY)
        guided = conditional + self.weight * (conditional - context_free)
        return guided.masked_fill(~plausible, -math.inf)


def consensus(candidates: Sequence[str]) -> str:
    """Minimum Bayes risk choice: the candidate whose mean ROUGE-1/2/L F1 (stemmed) with the other candidates is the
    highest, the earlier (better-ranked) one on ties (Kumar & Byrne 2004; Freitag et al. 2022)."""
    from rouge_score.rouge_scorer import RougeScorer

    if len(candidates) < 3:
        return candidates[0]
    scorer = RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    support = [0.0] * len(candidates)
    for i in range(len(candidates)):
        for j in range(i + 1, len(candidates)):
            scores = scorer.score(candidates[i], candidates[j]).values()
            agreement = sum(score.fmeasure for score in scores) / 3
            support[i] += agreement
            support[j] += agreement
    return candidates[support.index(max(support))]


def left_padded(rows: list[list[int]], tokenizer) -> dict[str, torch.Tensor]:
    """Prompts padded on the left, so every row's continuation starts at the same position."""
    width = max(len(row) for row in rows)
    pad_id = tokenizer.pad_token_id
    return {
        "input_ids": torch.tensor([[pad_id] * (width - len(row)) + row for row in rows], dtype=torch.long),
        "attention_mask": torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows], dtype=torch.long),
    }


class Summarizer:
    """A trained CHQ→FAQ summarizer; `rewrite` is the pipeline's question-rewriting stage."""

    def __init__(
        self, model, tokenizer, device: str = "cpu", decoding: Decoding = GREEDY, max_source_len: int = 512, fast=None
    ):
        """`model`: a transformers model (None with `fast`, a :class:`summarizer.ct2.CT2Generator`, which then
        generates instead); `decoding`: what `rewrite` uses, the settings the model was validated with."""
        self.model = model.eval() if model is not None else None
        self.tokenizer, self.device, self.fast = tokenizer, device, fast
        self.decoding, self.max_source_len = decoding, max_source_len
        self.vocabulary: TrimmedVocabulary | None = None  # set (and applied to the model) by `trimmed`

    @classmethod
    def load(
        cls,
        model: str | Path,
        device: str | None = None,
        quantize: bool = False,
        int8_backend: str = "auto",
        direction: str = "summarize",
    ) -> Summarizer:
        """Load a trained summarizer directory (seq2seq or decoder-only) resolved by `common.runtime.resolve_model`;
        `quantize`: int8 on CPU through `int8_backend`: ``ctranslate2`` (decoder-only models; converted once into
        ``<model>/ct2-int8``), ``torch`` (PyTorch dynamic quantisation of the linear layers), or ``auto``: CTranslate2
        for decoder-only models, PyTorch for seq2seq ones; `direction`: what the model must have been trained for
        (``summarize``, or ``ask`` for the question writer)."""
        if int8_backend not in INT8_BACKENDS:
            raise MedfaqError(f"unknown int8 backend {int8_backend!r}; choose {', '.join(INT8_BACKENDS)}")
        path, saved = trained_summarizer(model, QUESTION_WRITER if direction == "ask" else SUMMARIZER)
        device = "cpu" if quantize else choose_device(device)
        settings = {
            "decoding": Decoding(num_beams=saved.get("eval_beams", 1), max_length=saved.get("eval_max_length", 64)),
            "max_source_len": saved.get("max_source_len", 512),
        }
        if quantize and int8_backend != "torch" and backbone_is_causal(path):
            from medfaq.summarizer.ct2 import CT2Generator

            tokenizer = load_tokenizer(path)
            return cls(None, tokenizer, device, fast=CT2Generator(path, tokenizer), **settings)
        if quantize and int8_backend == "ctranslate2":
            raise MedfaqError(
                "the ctranslate2 int8 backend serves decoder-only summarizers; use torch for seq2seq ones"
            )
        network, tokenizer = load_backbone(path)
        if quantize:
            quantize_linear(network)
        return cls(network.to(device), tokenizer, device, **settings)

    @contextmanager
    def trimmed(self, vocabulary: TrimmedVocabulary) -> Iterator[None]:
        """Generate over `vocabulary`'s tokens only inside the block (a decoder-only model on PyTorch)."""
        if self.fast is not None or not is_causal_lm(self.model):
            raise MedfaqError("a trimmed vocabulary applies to a decoder-only model on PyTorch")
        with vocabulary.applied(self.model):
            self.vocabulary = vocabulary
            try:
                yield
            finally:
                self.vocabulary = None

    def seed(self, seed: int) -> None:
        """Seed sampled decoding (`Decoding.sample`) on whichever runtime generates."""
        torch.manual_seed(seed)
        if self.fast is not None:
            import ctranslate2

            ctranslate2.set_random_seed(seed)

    def summarize(self, texts: list[str], decoding: Decoding = GREEDY, batch_size: int = 16) -> list[str]:
        """One short FAQ-style question per input text: the best beam, or the :func:`consensus` of the `decoding.mbr`
        best."""
        return [consensus(beams) for beams in self.candidates(texts, decoding, batch_size)]

    def candidates(self, texts: list[str], decoding: Decoding = GREEDY, batch_size: int = 16) -> list[list[str]]:
        """The `decoding.mbr` best beams per input text, best first."""
        if batch_size < 1:
            raise MedfaqError("batch_size must be at least 1")
        if self.fast is None:
            return generate_candidates(
                self.model,
                self.tokenizer,
                texts,
                decoding,
                batch_size=batch_size,
                max_source_len=self.max_source_len,
                device=self.device,
                progress=len(texts) > batch_size,
                vocabulary=self.vocabulary,
            )
        if decoding.guidance:
            raise MedfaqError("context-aware decoding (guidance) runs on the fp32 model, not the int8 one")
        from tqdm.auto import tqdm

        starts = tqdm(range(0, len(texts), batch_size), desc="summarize", disable=len(texts) <= batch_size, leave=False)
        return [
            found
            for start in starts
            for found in self.fast(texts[start : start + batch_size], decoding, self.max_source_len)
        ]

    def rewrite(self, texts: list[str]) -> list[str]:
        """`summarize` with the beam size and length the model was validated with."""
        return self.summarize(texts, self.decoding)
