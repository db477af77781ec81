"""The ``likelihood`` stage: :class:`summarizer.likelihood.SummaryLikelihood` over the summarizer (the rewrite
stage's model) scores the top `depth` hits by how likely it finds each FAQ question as the question's summary, less
`prior` x its likelihood given no question; that ranking joins the reranking RRF with weight `weight`, behind the
same dense-margin gate (the rerank stage's settings). The confidence stays on its scale: the top hit's cosine (or
cross-encoder score), so calibrated thresholds still hold."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from medfaq.common.runtime import PRECISION_HELP, PRECISIONS
from medfaq.common.settings import setting
from medfaq.retriever.search import Hit, Retriever
from medfaq.retriever.stages.base import MAX_HITS, DemoSwitch, Stage, StageLoader, StageRun, StageSettings
from medfaq.retriever.stages.rewrite import locate_summarizer


@runtime_checkable
class LikelihoodScorer(Protocol):
    """How likely a summarizer finds each candidate FAQ question as the summary of the query, corrected by
    `prior_weight` x its likelihood given no query, per token or summed (summarizer/likelihood.py)."""

    def score(self, query: str, candidates: list[str], prior_weight: float, per_token: bool) -> list[float]: ...


@dataclass(frozen=True)
class LikelihoodSettings:
    """`per_token`: the likelihood per token (else summed); `vocabulary`: what a decoder-only summarizer normalises
    over; `precision`: its arithmetic."""

    on: bool = setting(
        False,
        help="Rerank the top hits by how likely the summarizer finds each FAQ question as the question's summary.",
        flag=True,
        request=True,
    )
    depth: int = setting(
        10, help="How many top hits the summary likelihood scores.", flag=True, ge=1, le=MAX_HITS, request=True
    )
    prior: float = setting(1.0, help="Weight of an FAQ question's likelihood given no question.", ge=0)
    per_token: bool = setting(True, help="Score the likelihood per token (else summed).")
    weight: float = setting(1.0, help="Weight of the likelihood ranking in the reranking RRF.", gt=0)
    vocabulary: str = setting(
        "bank",
        help="Tokens a decoder-only summarizer's likelihood normalises over: bank (those of the index's FAQ questions, "
        "the full softmax restricted and renormalised: far cheaper) or full.",
        choices=("bank", "full"),
    )
    precision: str = setting("auto", help="The likelihood stage's arithmetic: " + PRECISION_HELP, choices=PRECISIONS)


def load_likelihood(model: str, settings: StageSettings) -> Any:
    from medfaq.summarizer.likelihood import SummaryLikelihood

    return SummaryLikelihood.load(
        model,
        quantize=settings.quantize,
        vocabulary=settings.likelihood_vocabulary,
        precision=settings.likelihood_precision,
    )


class LikelihoodStage(Stage):
    name = "likelihood"
    settings = LikelihoodSettings
    argument = "likelihood"
    loader = StageLoader(
        load_likelihood, reads=("quantize", "likelihood_vocabulary", "likelihood_precision"), locate=locate_summarizer
    )
    model = "summarizer"
    rescores = True
    demo = DemoSwitch("Rank by the summarizer's likelihood", "likelihood")

    def depth(self, settings: LikelihoodSettings) -> int:
        return settings.depth

    def attach(self, scorer: LikelihoodScorer, retriever: Retriever) -> None:
        """A scorer that trims its vocabulary to a bank's FAQ questions keeps this index's."""
        if hasattr(scorer, "keep_bank"):
            scorer.keep_bank(retriever.bank(), retriever.faq_questions)

    def scores(
        self,
        scorer: LikelihoodScorer,
        settings: LikelihoodSettings,
        query: str,
        summary: str | None,
        hits: list[Hit],
        pipeline: StageRun,
    ) -> list[float]:
        """The likelihood of each hit's FAQ question given the raw question."""
        return scorer.score(query, [hit.question for hit in hits], settings.prior, settings.per_token)

    def weight(self, scorer: LikelihoodScorer, settings: LikelihoodSettings) -> float | None:
        return settings.weight


STAGE = LikelihoodStage()
