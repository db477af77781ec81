"""Generation with a trained summarizer: batched greedy or beam search with the KV cache, inputs sorted by length;
optionally the minimum Bayes risk choice among the best beams (`consensus`).

Seq2seq models read the CHQ; decoder-only models read the cleaned CHQ + separator (left-padded) and continue it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from index.runtime import MedfaqError, choose_device, quantize_linear, resolve_model
from summarizer.modeling import backbone_is_causal, is_causal_lm, load_backbone, load_tokenizer, prompt_ids

CONFIG_FILE = "train_config.json"
INT8_BACKENDS = ("auto", "ctranslate2", "torch")


def generate_candidates(
    model,
    tokenizer,
    texts: Sequence[str],
    num_return: int = 1,
    num_beams: int = 1,
    max_length: int = 64,
    batch_size: int = 16,
    max_source_len: int = 512,
    device: str = "cpu",
    progress: bool = True,
) -> list[list[str]]:
    """The `num_return` best beams for each of `texts` (beam width at least `num_return`), best first, in input
    order; batches hold inputs of similar length to waste little padding."""
    from tqdm.auto import tqdm

    num_beams = max(num_beams, num_return)
    causal = is_causal_lm(model)
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
            encoded = {key: value.to(device) for key, value in encoded.items()}
            generated = model.generate(
                input_ids=encoded["input_ids"],
                attention_mask=encoded["attention_mask"],
                num_beams=num_beams,
                num_return_sequences=num_return,
                do_sample=False,
                use_cache=True,
                max_new_tokens=max_length,
                early_stopping=num_beams > 1,
            )
            if causal:
                generated = generated[:, encoded["input_ids"].size(1) :]
            decoded = tokenizer.batch_decode(generated, skip_special_tokens=True)
            for row, i in enumerate(chunk):
                outputs[i] = [" ".join(text.split()) for text in decoded[row * num_return : (row + 1) * num_return]]
    return outputs


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
        self,
        model,
        tokenizer,
        device: str = "cpu",
        num_beams: int = 1,
        max_length: int = 64,
        max_source_len: int = 512,
        fast=None,
    ):
        """`model`: a transformers model (None with `fast`, a :class:`summarizer.ct2.CT2Generator`, which then
        generates instead)."""
        self.model = model.eval() if model is not None else None
        self.tokenizer, self.device, self.fast = tokenizer, device, fast
        self.num_beams, self.max_length, self.max_source_len = num_beams, max_length, max_source_len

    @classmethod
    def load(
        cls, model: str | Path, device: str | None = None, quantize: bool = False, int8_backend: str = "auto"
    ) -> Summarizer:
        """Load a trained summarizer directory (seq2seq or decoder-only) resolved by `index.runtime.resolve_model`;
        `quantize`: int8 on CPU through `int8_backend`: ``ctranslate2`` (decoder-only models; converted once into
        ``<model>/ct2-int8``), ``torch`` (PyTorch dynamic quantisation of the linear layers), or ``auto``: CTranslate2
        for decoder-only models, PyTorch for seq2seq ones."""
        if int8_backend not in INT8_BACKENDS:
            raise MedfaqError(f"unknown int8 backend {int8_backend!r}; choose {', '.join(INT8_BACKENDS)}")
        path = Path(resolve_model(model))
        config_file = path / CONFIG_FILE
        if not config_file.is_file():
            raise MedfaqError(
                f"{path} is not a trained summarizer (no {CONFIG_FILE}); train one with `medfaq train summarizer`"
            )
        saved = json.loads(config_file.read_text(encoding="utf-8"))
        device = "cpu" if quantize else choose_device(device)
        settings = {
            "num_beams": saved.get("eval_beams", 1),
            "max_length": saved.get("eval_max_length", 64),
            "max_source_len": saved.get("max_source_len", 512),
        }
        if quantize and int8_backend != "torch" and backbone_is_causal(path):
            from summarizer.ct2 import CT2Generator

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

    def summarize(
        self, texts: list[str], num_beams: int = 1, max_length: int = 64, batch_size: int = 16, mbr: int = 1
    ) -> list[str]:
        """One short FAQ-style question per input text; `mbr` > 1: the :func:`consensus` of the `mbr` best beams."""
        return [consensus(found) for found in self.candidates(texts, mbr, num_beams, max_length, batch_size)]

    def candidates(
        self, texts: list[str], num_return: int, num_beams: int = 1, max_length: int = 64, batch_size: int = 16
    ) -> list[list[str]]:
        """The `num_return` best beams per input text, best first."""
        if min(num_return, num_beams, max_length, batch_size) < 1:
            raise MedfaqError("num_beams, mbr candidates, max_length and batch_size must be at least 1")
        if self.fast is not None:
            from tqdm.auto import tqdm

            starts = range(0, len(texts), batch_size)
            bar = tqdm(starts, desc="summarize", disable=len(texts) <= batch_size, leave=False)
            return [
                found
                for start in bar
                for found in self.fast(
                    texts[start : start + batch_size], num_beams, max_length, self.max_source_len, num_return
                )
            ]
        return generate_candidates(
            self.model,
            self.tokenizer,
            texts,
            num_return,
            num_beams=num_beams,
            max_length=max_length,
            batch_size=batch_size,
            max_source_len=self.max_source_len,
            device=self.device,
            progress=len(texts) > batch_size,
        )

    def rewrite(self, texts: list[str]) -> list[str]:
        """`summarize` with the beam size and length the model was validated with."""
        return self.summarize(texts, num_beams=self.num_beams, max_length=self.max_length)
