"""The ``rerank`` stage: the cross-encoder rescores the top `depth` hits (default model: the one `medfaq setup`
trains) on the runtime :func:`rerank_backend` picks: :class:`retriever.reranker.onnx.OnnxReranker` (ONNX Runtime, no
torch) or :class:`retriever.reranker.model.CrossEncoderReranker` (PyTorch); with ``quantize`` the ONNX reranker runs
its int8 graph and the PyTorch one its linear layers in int8.

Its settings also hold the reranking RRF that every rescoring stage's ranking joins (`retrieval_weight`, `rrf_k`)
and the dense-margin gate in front of them (`margin`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from medfaq.common.runtime import PRECISION_HELP, PRECISIONS
from medfaq.common.settings import setting
from medfaq.retriever.reranker.base import trained_crossencoder
from medfaq.retriever.search import Hit
from medfaq.retriever.stages.base import MAX_HITS, DemoSwitch, Stage, StageLoader, StageRun, StageSettings, set_up_model
from medfaq.retriever.trained_models import RERANKER_MODEL

DEFAULT_RERANKER = RERANKER_MODEL
RERANK_QUERIES = ("auto", "raw", "summary")
RERANK_FUSIONS = ("auto", "replace", "rrf")
RERANK_MARGIN = 0.05  # the dense-margin gate chosen on development queries (the `rerank_margin` setting)


@runtime_checkable
class Reranker(Protocol):
    """Scores (query, candidate question) pairs; higher is a better match (e.g. a cross-encoder)."""

    def score(self, query: str, candidates: list[str]) -> list[float]: ...


def corrects_first_stage(reranker: Reranker | None) -> bool:
    """Whether `reranker`'s scores already contain the first stage's (a reranker trained as a correction of the
    bi-encoder, ``--prior-scale``): ordering by them alone then keeps what the first stage knew."""
    return bool(getattr(reranker, "corrects_first_stage", False))


@dataclass(frozen=True)
class RerankSettings:
    """`depth`: how many fused hits the cross-encoder rescores (the rest keep their order below them).
    `max_length`: tokens of each (question, FAQ) pair it reads, the question cut first (None = the length it was
    trained with). `query`: what it reads, ``auto`` = the summary when the search used the summary alone, else the
    question. `fusion`: ``replace`` orders the rescored hits by the cross-encoder alone, ``rrf`` by RRF of their
    retrieval and cross-encoder ranks (a weak reranker then cannot bury a strong retrieval hit), ``auto`` replace
    for a reranker trained as a correction of the bi-encoder (its scores contain the cosine), else rrf.
    `retrieval_weight` and `rrf_k`: weight of the retrieval ranking against the cross-encoder ranking's 1 in that
    RRF, and its constant k (3 and 10: chosen on development queries, docs/results.md); every rescoring stage's
    ranking joins it. `margin`: rescore only the questions dense search is unsure of, those whose top two cosines
    differ by less than this; for the others the retrieval order stands and the cross-encoder scores the top hit
    alone (for the confidence). None: every question. It applies to dense search over one query source;
    `RERANK_MARGIN` (0.05) kept development queries' Recall@1 while reranking a fifth of them. `precision`: the
    cross-encoder's matrix products, ``fp32``, ``bf16`` or ``auto`` (bf16 where this machine measures it faster)."""

    on: bool = setting(False, help="Rerank the top hits with a cross-encoder.", flag=True, request=True)
    model: str | None = setting(
        None, help="Cross-encoder model (directory or name under $MEDFAQ_HOME/models).", flag=True
    )
    depth: int = setting(
        20, help="How many top hits the cross-encoder rescores.", flag=True, ge=1, le=MAX_HITS, request=True
    )
    max_length: int | None = setting(
        None, help="Tokens per (question, FAQ) pair the cross-encoder reads.", flag=True, ge=8
    )
    query: str = setting(
        "auto",
        help="What the cross-encoder reads (auto: the summary when the search used it alone).",
        choices=RERANK_QUERIES,
    )
    fusion: str = setting(
        "rrf",
        help="replace: order by the cross-encoder; rrf: RRF of retrieval and cross-encoder ranks; auto: replace for "
        "a reranker trained with --prior-scale, else rrf.",
        flag=True,
        choices=RERANK_FUSIONS,
        request=True,
    )
    retrieval_weight: float = setting(3.0, help="Weight of the retrieval ranking in the reranking RRF.", gt=0)
    rrf_k: int = setting(10, help="The constant k of the reranking RRF.", ge=0)
    margin: float | None = setting(
        None,
        help="Rerank (cross-encoder and likelihood) only questions whose top two dense cosines differ by less than "
        "this (e.g. 0.05); default: all.",
        flag=True,
        ge=0,
        request=True,
    )
    precision: str = setting(
        "fp32", help="The cross-encoder's arithmetic: " + PRECISION_HELP, flag=True, choices=PRECISIONS
    )


def locate_reranker(name: str | None) -> str:
    """The cross-encoder `name` means (None: the one `medfaq setup` trains); a wrong name or path fails here,
    before the model libraries load."""
    return str(trained_crossencoder(set_up_model(name, "reranker", DEFAULT_RERANKER)))


def load_reranker(model: str, settings: StageSettings) -> Any:
    if rerank_backend(settings) == "onnx":
        from medfaq.retriever.reranker.onnx import OnnxReranker

        return OnnxReranker.load(model, quantize=settings.quantize, max_length=settings.rerank_max_length)
    from medfaq.retriever.reranker.model import CrossEncoderReranker

    return CrossEncoderReranker.load(
        model, quantize=settings.quantize, max_length=settings.rerank_max_length, precision=settings.rerank_precision
    )


def rerank_backend(config: StageSettings) -> str:
    """``onnx`` or ``torch``: the reranker runs where the query encoder does (`config.encoder_backend`, ``auto``:
    ONNX Runtime on the CPU), on PyTorch when its products are asked in bf16 (`config.rerank_precision`)."""
    from medfaq.index.encoder import resolve_backend

    if config.rerank_precision != "fp32":
        return "torch"
    return "torch" if resolve_backend(config.encoder_backend) == "torch" else "onnx"


class RerankStage(Stage):
    name = "rerank"
    settings = RerankSettings
    flat_names = {"model": "reranker"}
    argument = "reranker"
    loader = StageLoader(
        load_reranker,
        reads=("quantize", "rerank_max_length", "rerank_precision", "encoder_backend"),
        locate=locate_reranker,
    )
    model = "reranker"
    rescores = True
    scores_top_when_sure = True  # its score of the top hit is the confidence
    demo = DemoSwitch("Rerank with the cross-encoder", "reranker")

    def depth(self, settings: RerankSettings) -> int:
        return settings.depth

    def scores(
        self,
        reranker: Reranker,
        settings: RerankSettings,
        query: str,
        summary: str | None,
        hits: list[Hit],
        pipeline: StageRun,
    ) -> list[float]:
        """The cross-encoder's score of each hit: of its FAQ question, or of the best of its phrasings (the wordings
        experts linked to it) where one scores higher; all in one call. It reads the question, or its summary
        (`query`)."""
        wanted = settings.query
        if wanted == "auto":
            wanted = "summary" if summary and pipeline.config.query_source == "summary" else "raw"
        text = (summary or query) if wanted == "summary" else query
        owners, texts = [], []
        for row, hit in enumerate(hits):
            wordings = pipeline.retriever.wordings(hit)
            owners += [row] * len(wordings)
            texts += wordings
        best = [float("-inf")] * len(hits)
        for row, score in zip(owners, reranker.score(text, texts), strict=True):
            best[row] = max(best[row], float(score))
        return best

    def weight(self, reranker: Reranker, settings: RerankSettings) -> float | None:
        fusion = settings.fusion
        if fusion == "auto":
            fusion = "replace" if corrects_first_stage(reranker) else "rrf"
        return None if fusion == "replace" else 1.0


STAGE = RerankStage()
