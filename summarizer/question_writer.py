"""The question writer: the summarizer's reverse direction. It reads an FAQ (its question and the head of its answer)
and writes, by nucleus sampling, consumer questions that FAQ answers; `medfaq index adapt` uses them as the bank's
own training queries, phrasings and development queries.

Trained with `medfaq train question-writer` on the summarization pairs turned round (`WRITER_TRAIN`: each FAQ-style
summary or FAQ -> the consumer question it was written for), so it writes both the short questions of RQE and the
long ones of HealthCareMagic and CHQ-Summ.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from medfaq.common.runtime import MedfaqError, resolve_model
from medfaq.summarizer.decoding import Decoding
from medfaq.summarizer.generation import Summarizer

WRITER_TRAIN = "meqsum:train+healthcaremagic:train+chq_summ:train+rqe:train"
WRITER_VALID = "meqsum:valid"
ANSWER_WORDS = 32  # words of the answer the writer reads after the FAQ's question
ANSWER_SEPARATOR = " | "
# Training targets: long consumer questions cut at 64 tokens; the FAQ and the head of its answer fit in 96
WRITER_SETTINGS = {"variant": "mle", "direction": "ask", "max_source_len": 96, "max_target_len": 64}


def writer_input(question: str, answer: str = "") -> str:
    """What the writer reads for one FAQ: its question, then the first `ANSWER_WORDS` words of its answer."""
    question = " ".join(question.split())
    head = " ".join(answer.split()[:ANSWER_WORDS])
    return f"{question}{ANSWER_SEPARATOR}{head}" if head else question


def reversed_pairs(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """(CHQ, FAQ) summarization pairs as (FAQ, CHQ) question-writing pairs."""
    return [(faq, chq) for chq, faq in pairs]


def sampling(k: int, max_length: int = 64, top_p: float = 0.9, temperature: float = 1.0) -> Decoding:
    """`k` independent nucleus samples per FAQ."""
    return Decoding(max_length=max_length, mbr=k, sample=True, top_p=top_p, temperature=temperature)


class QuestionWriter:
    """A trained question writer (`medfaq train question-writer`)."""

    def __init__(self, model: Summarizer, path: Path):
        self.model, self.path = model, path

    @classmethod
    def load(cls, model: str | Path, quantize: bool = False) -> QuestionWriter:
        """Load a question writer directory; a summarizer (or any other model) is a one-line error."""
        path = Path(resolve_model(model))
        return cls(Summarizer.load(path, device="cpu", quantize=quantize, direction="ask"), path)

    def write(
        self, faqs: Sequence[tuple[str, str]], k: int, seed: int = 0, batch_size: int = 16, top_p: float = 0.9
    ) -> list[list[str]]:
        """`k` sampled questions for each (question, answer) FAQ, in input order, repeats and blanks ("") as sampled;
        the same seed writes the same questions."""
        if k < 1:
            raise MedfaqError(f"the questions per FAQ must be at least 1, got {k}")
        self.model.seed(seed)
        texts = [writer_input(question, answer) for question, answer in faqs]
        return self.model.candidates(texts, sampling(k, top_p=top_p), batch_size=batch_size)
