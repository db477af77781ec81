"""The question writer: the summarizer's reverse direction. It reads an FAQ (its question and the head of its answer)
and writes, by nucleus sampling, consumer questions that FAQ answers; `medfaq index adapt` uses them as the bank's
own training queries, phrasings and development queries.

Trained with `medfaq train question-writer` on the summarization pairs turned round (`WRITER_TRAIN`: each FAQ-style
summary or FAQ -> the consumer question it was written for), so it writes both the short questions of RQE and the
long ones of HealthCareMagic and CHQ-Summ.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from medfaq.common.runtime import MedfaqError, cast_for_inference, resolve_model
from medfaq.summarizer.decoding import Decoding
from medfaq.summarizer.generation import Summarizer
from medfaq.summarizer.modeling import is_causal_lm, load_tokenizer, prompt_ids
from medfaq.summarizer.vocabulary import TrimmedVocabulary, token_ids

WRITER_TRAIN = "meqsum:train+healthcaremagic:train+chq_summ:train+rqe:train"
WRITER_VALID = "meqsum:valid"
ANSWER_WORDS = 32  # words of the answer the writer reads after the FAQ's question
ANSWER_SEPARATOR = " | "
# Training targets: long consumer questions cut at 64 tokens; the FAQ and the head of its answer fit in 96
WRITER_SETTINGS = {"variant": "mle", "direction": "ask", "max_source_len": 96, "max_target_len": 64}
VOCABULARY_FILE = "vocabulary.json"  # a decoder-only writer's output tokens: those of its training texts
MAX_NEW_TOKENS = 48  # a written question's length cap (the longest consumer questions are cut)


def save_vocabulary(model_dir: Path, texts: Sequence[str]) -> int:
    """Keep the token ids of `texts` (the writer's training pairs) beside a decoder-only writer: it writes with
    them alone (summarizer/vocabulary.py). Returns how many."""
    ids = sorted(token_ids(load_tokenizer(model_dir), texts))
    (Path(model_dir) / VOCABULARY_FILE).write_text(json.dumps(ids) + "\n", encoding="utf-8")
    return len(ids)


def writer_input(question: str, answer: str = "") -> str:
    """What the writer reads for one FAQ: its question, then the first `ANSWER_WORDS` words of its answer."""
    question = " ".join(question.split())
    head = " ".join(answer.split()[:ANSWER_WORDS])
    return f"{question}{ANSWER_SEPARATOR}{head}" if head else question


def reversed_pairs(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """(CHQ, FAQ) summarization pairs as (FAQ, CHQ) question-writing pairs."""
    return [(faq, chq) for chq, faq in pairs]


def sampling(k: int, max_length: int = MAX_NEW_TOKENS, top_p: float = 0.9, temperature: float = 1.0) -> Decoding:
    """`k` independent nucleus samples per FAQ."""
    return Decoding(max_length=max_length, mbr=k, sample=True, top_p=top_p, temperature=temperature)


class QuestionWriter:
    """A trained question writer (`medfaq train question-writer`). A decoder-only writer with its
    ``vocabulary.json`` samples over those tokens and the tokens of the FAQs it reads only (about a tenth of
    Gemma's 262,144), in bf16 where this CPU measures bf16 faster."""

    def __init__(self, model: Summarizer, path: Path):
        self.model, self.path = model, path
        vocabulary = path / VOCABULARY_FILE
        trimmable = model.fast is None and is_causal_lm(model.model) and vocabulary.is_file()
        self.vocabulary = set(json.loads(vocabulary.read_text(encoding="utf-8"))) if trimmable else None

    @classmethod
    def load(cls, model: str | Path, quantize: bool = False, precision: str = "auto") -> QuestionWriter:
        """Load a question writer directory; a summarizer (or any other model) is a one-line error. `quantize`:
        int8 (CTranslate2 for a decoder-only writer); else fp32, or bf16 where `precision` resolves to it."""
        path = Path(resolve_model(model))
        summarizer = Summarizer.load(path, device="cpu", quantize=quantize, direction="ask")
        if not quantize:
            cast_for_inference(summarizer.model, precision)
        return cls(summarizer, path)

    def write(
        self, faqs: Sequence[tuple[str, str]], k: int, seed: int = 0, batch_size: int = 16, top_p: float = 0.9
    ) -> list[list[str]]:
        """`k` sampled questions for each (question, answer) FAQ, in input order, repeats and blanks ("") as sampled;
        the same seed writes the same questions."""
        if k < 1:
            raise MedfaqError(f"the questions per FAQ must be at least 1, got {k}")
        self.model.seed(seed)
        texts = [writer_input(question, answer) for question, answer in faqs]
        if self.vocabulary is None:
            return self.model.candidates(texts, sampling(k, top_p=top_p), batch_size=batch_size)
        tokenizer, width = self.model.tokenizer, self.model.max_source_len
        read = {i for text in texts for i in prompt_ids(tokenizer, text, width)[0]}
        with self.model.trimmed(TrimmedVocabulary(tokenizer, self.vocabulary | read)):
            return self.model.candidates(texts, sampling(k, top_p=top_p), batch_size=batch_size)
