"""The ``rewrite`` stage: the summarizer writes each question as a short FAQ-style question before retrieval
(:class:`summarizer.generation.Summarizer`; default: the best summarizer `medfaq setup` trained under
``$MEDFAQ_HOME/models``, see :mod:`retriever.trained_models`), generating with the config's beams and length; with
``quantize`` its linear layers run in int8 (PyTorch dynamic quantisation, CPU only)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from medfaq.common.model_kinds import SUMMARIZER, check_model_kind
from medfaq.common.runtime import resolve_model
from medfaq.common.settings import setting
from medfaq.retriever.stages.base import Batch, DemoSwitch, Stage, StageLoader, StageRun, StageSettings, set_up_model
from medfaq.retriever.trained_models import best_summarizer


@runtime_checkable
class QueryRewriter(Protocol):
    """Turns consumer questions into short FAQ-style questions (e.g. the ECL summarizer)."""

    def rewrite(self, texts: list[str]) -> list[str]: ...


@dataclass(frozen=True)
class RewriteSettings:
    """`beams` / `max_length`: generation settings (None = those the summarizer was validated with)."""

    on: bool = setting(
        False,
        help="Summarize the question first; set alone, search with the question and its summary fused.",
        flag=True,
        request=True,
    )
    model: str | None = setting(None, help="Summarizer model (directory or name under $MEDFAQ_HOME/models).", flag=True)
    beams: int | None = setting(None, help="Summarizer beams (1 = greedy).", flag=True, aliases=("--beams",), ge=1)
    max_length: int | None = setting(None, help="Summarizer's longest summary, in tokens.", ge=1)


class SummarizerRewriter:
    """The :class:`QueryRewriter` over a Summarizer, with fixed generation settings (None = the beams and length the
    summarizer was validated with)."""

    def __init__(self, summarizer: Any, num_beams: int | None = None, max_length: int | None = None) -> None:
        self.summarizer = summarizer
        validated = summarizer.decoding
        self.decoding = replace(
            validated, num_beams=num_beams or validated.num_beams, max_length=max_length or validated.max_length
        )

    def rewrite(self, texts: list[str]) -> list[str]:
        return self.summarizer.summarize(list(texts), self.decoding)


def locate_summarizer(name: str | None) -> str:
    """The summarizer directory `name` means (None: the best one trained under the models directory); a model of
    another kind fails here, before the model libraries load."""
    location = resolve_model(set_up_model(name, "summarizer", best_summarizer()))
    check_model_kind(location, SUMMARIZER, location)
    return location


def load_rewriter(model: str, settings: StageSettings) -> SummarizerRewriter:
    from medfaq.summarizer.generation import Summarizer

    summarizer = Summarizer.load(model, quantize=settings.quantize)
    return SummarizerRewriter(summarizer, settings.summary_beams, settings.summary_max_length)


class RewriteStage(Stage):
    name = "rewrite"
    settings = RewriteSettings
    flat_names = {
        "on": "summarize",
        "model": "summarizer",
        "beams": "summary_beams",
        "max_length": "summary_max_length",
    }
    argument = "rewriter"
    loader = StageLoader(
        load_rewriter, reads=("quantize", "summary_beams", "summary_max_length"), locate=locate_summarizer
    )
    model = "summarizer"
    before_retrieval = True
    demo = DemoSwitch("Summarize my question", "summarizer")

    def run(self, rewriter: QueryRewriter, settings: RewriteSettings, batch: Batch, pipeline: StageRun) -> None:
        """Each question's summary (the question itself where the summary is blank); with `exact_batches` the
        summarizer takes the questions one at a time."""
        with pipeline.timed(self.name, batch.timings):
            queries = batch.queries
            if pipeline.exact_batches:
                written = [summary for query in queries for summary in rewriter.rewrite([query])]
            else:
                written = rewriter.rewrite(queries)
            batch.summaries = [summary.strip() or query for query, summary in zip(queries, written, strict=True)]


STAGE = RewriteStage()
