"""The search pipeline: optional query rewrite (summarizer) -> retrieval -> optional rerank -> abstain decision.

Stages are small protocols, so later components (the ECL summarizer, the cross-encoder) plug in without callers
changing: build a :class:`Pipeline` with the stage objects, or register a loader by name with
:func:`register_stage_loader` and let :meth:`Pipeline.from_config` build them from a saved :class:`PipelineConfig`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from index.faq_index import FaqIndex
from index.runtime import MedfaqError
from retriever.search import MAX_QUERY_CHARS, MODES, RRF_K, Hit, Retriever, clean_queries, reciprocal_rank_fusion

PIPELINE_FILE = "pipeline.json"
QUERY_SOURCES = ("raw", "summary", "both")
STAGE_KINDS = ("rewrite", "rerank", "entities")


@runtime_checkable
class QueryRewriter(Protocol):
    """Turns consumer questions into short FAQ-style questions (e.g. the ECL summarizer)."""

    def rewrite(self, texts: list[str]) -> list[str]: ...


@runtime_checkable
class Reranker(Protocol):
    """Scores (query, candidate question) pairs; higher is a better match (e.g. a cross-encoder)."""

    def score(self, query: str, candidates: list[str]) -> list[float]: ...


@runtime_checkable
class EntityFinder(Protocol):
    """Finds medical entities in a question (returned in `SearchResponse.entities`)."""

    def find(self, text: str) -> list[Any]: ...


@dataclass
class PipelineConfig:
    """What the pipeline runs; saved as ``pipeline.json`` beside an index."""

    mode: str = "hybrid"
    top_k: int = 10
    candidates: int = 50
    query_source: str = "raw"
    summarize: bool = False
    summarizer: str | None = None
    rerank: bool = False
    reranker: str | None = None
    abstain: bool = False
    threshold: float = 0.5
    max_query_chars: int = MAX_QUERY_CHARS
    rrf_k: int = RRF_K

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise MedfaqError(f"unknown search mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.query_source not in QUERY_SOURCES:
            raise MedfaqError(f"unknown query source {self.query_source!r}; choose one of {', '.join(QUERY_SOURCES)}")
        if self.query_source != "raw" and not self.summarize:
            raise MedfaqError(f"query source {self.query_source!r} needs summarize=true")
        if self.top_k < 1 or self.candidates < 1:
            raise MedfaqError("top_k and candidates must be at least 1")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PipelineConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise MedfaqError(f"unknown pipeline setting(s): {', '.join(unknown)}")
        return cls(**data)

    def save(self, directory: str | Path) -> Path:
        """Write ``pipeline.json`` into `directory` (an index directory); the file survives index saves."""
        path = Path(directory) / PIPELINE_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, directory: str | Path) -> PipelineConfig:
        """``pipeline.json`` of `directory`, or the defaults when there is none."""
        path = Path(directory) / PIPELINE_FILE
        if not path.is_file():
            return cls()
        try:
            return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, TypeError) as error:
            raise MedfaqError(f"{path} is not a valid pipeline config: {error}") from None


@dataclass
class SearchResponse:
    """Everything one question produced: the summary used, entities, ranked hits, the abstain flag, stage timings."""

    query: str
    summary: str | None
    entities: list[Any]
    hits: list[Hit]
    abstained: bool
    timings_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["entities"] = [asdict(e) if hasattr(e, "__dataclass_fields__") else e for e in self.entities]
        return data


_STAGE_LOADERS: dict[str, Callable[[str | None], Any]] = {}


def register_stage_loader(kind: str, loader: Callable[[str | None], Any]) -> None:
    """Let :meth:`Pipeline.from_config` build a stage from its configured name: `kind` is one of `STAGE_KINDS`;
    `loader(name)` returns the stage object (``rewrite`` from `summarizer`, ``rerank`` from `reranker`)."""
    if kind not in STAGE_KINDS:
        raise ValueError(f"unknown stage kind {kind!r}")
    _STAGE_LOADERS[kind] = loader


class Pipeline:
    """Runs the configured stages for each question; without rewrite/rerank stages it is plain retrieval."""

    def __init__(
        self,
        index: FaqIndex,
        config: PipelineConfig | None = None,
        rewriter: QueryRewriter | None = None,
        reranker: Reranker | None = None,
        entity_finder: EntityFinder | None = None,
    ) -> None:
        self.config = config or PipelineConfig()
        if self.config.summarize and rewriter is None:
            raise MedfaqError("the pipeline config asks for summarization but no query-rewrite stage was given")
        if self.config.rerank and reranker is None:
            raise MedfaqError("the pipeline config asks for reranking but no rerank stage was given")
        self.index = index
        self.rewriter = rewriter if self.config.summarize else None
        self.reranker = reranker if self.config.rerank else None
        self.entity_finder = entity_finder
        self.retriever = Retriever(
            index, self.config.mode, self.config.candidates, self.config.rrf_k, self.config.max_query_chars
        )

    @classmethod
    def from_config(cls, index: FaqIndex, config: PipelineConfig | None = None) -> Pipeline:
        """Build the stages the config names through the registered stage loaders."""
        config = config or PipelineConfig()

        def stage(kind: str, wanted: bool, name: str | None) -> Any:
            if not wanted:
                return None
            if kind not in _STAGE_LOADERS:
                raise MedfaqError(f"no {kind} stage is available in this installation")
            return _STAGE_LOADERS[kind](name)

        entities = _STAGE_LOADERS["entities"](None) if "entities" in _STAGE_LOADERS else None
        return cls(
            index,
            config,
            rewriter=stage("rewrite", config.summarize, config.summarizer),
            reranker=stage("rerank", config.rerank, config.reranker),
            entity_finder=entities,
        )

    @classmethod
    def from_index_dir(cls, directory: str | Path, config: PipelineConfig | None = None) -> Pipeline:
        """Open the index in `directory` with its saved ``pipeline.json`` (or `config`)."""
        index = FaqIndex.load(directory)
        return cls.from_config(index, config or PipelineConfig.load(directory))

    def run(self, query: str) -> SearchResponse:
        return self.run_batch([query])[0]

    def run_batch(self, queries: list[str]) -> list[SearchResponse]:
        """One :class:`SearchResponse` per question, in order."""
        config = self.config
        start = time.perf_counter()
        queries = clean_queries(queries, config.max_query_chars)
        timings: dict[str, float] = {}
        summaries: list[str | None] = [None] * len(queries)
        if self.rewriter is not None:
            summaries = list(self.rewriter.rewrite(queries))
            timings["rewrite"] = _ms_since(start)
        entities = [self.entity_finder.find(q) if self.entity_finder else [] for q in queries]
        retrieve_start = time.perf_counter()
        hits = self._retrieve(queries, summaries)
        timings["retrieve"] = _ms_since(retrieve_start)
        if self.reranker is not None:
            rerank_start = time.perf_counter()
            hits = [self._rerank(s or q, h) for q, s, h in zip(queries, summaries, hits, strict=True)]
            timings["rerank"] = _ms_since(rerank_start)
        timings["total"] = _ms_since(start)
        per_query = {name: value / len(queries) for name, value in timings.items()}
        return [
            SearchResponse(q, s, e, h[: config.top_k], self._abstains(h), dict(per_query))
            for q, s, e, h in zip(queries, summaries, entities, hits, strict=True)
        ]

    def _retrieve(self, queries: list[str], summaries: list[str | None]) -> list[list[Hit]]:
        config = self.config
        depth = config.candidates if self.reranker is not None else config.top_k
        if config.query_source == "raw":
            return self.retriever.search(queries, depth)
        summary_hits = self.retriever.search([s or q for q, s in zip(queries, summaries, strict=True)], depth)
        if config.query_source == "summary":
            return summary_hits
        raw_hits = self.retriever.search(queries, depth)
        fused = []
        for raw, summary in zip(raw_hits, summary_hits, strict=True):
            by_id = {hit.id: hit for hit in raw + summary}
            ranking = reciprocal_rank_fusion([[(h.id, h.score) for h in raw], [(h.id, h.score) for h in summary]])
            fused.append(
                [
                    _rescored(by_id[doc_id], score, rank, "fusion")
                    for rank, (doc_id, score) in enumerate(ranking[:depth], 1)
                ]
            )
        return fused

    def _rerank(self, query: str, hits: list[Hit]) -> list[Hit]:
        if not hits:
            return hits
        scores = self.reranker.score(query, [hit.question for hit in hits])
        order = sorted(zip(scores, hits, strict=True), key=lambda pair: -pair[0])
        return [_rescored(hit, float(score), rank, "rerank") for rank, (score, hit) in enumerate(order, 1)]

    def _abstains(self, hits: list[Hit]) -> bool:
        """With `abstain` on: no hit, or the best hit's reranker score (else dense cosine) below the threshold."""
        if not self.config.abstain:
            return False
        if not hits:
            return True
        best = hits[0].stage_scores
        confidence = best.get("rerank", best.get("dense"))
        return confidence is None or confidence < self.config.threshold


def _rescored(hit: Hit, score: float, rank: int, stage: str) -> Hit:
    return Hit(**{**hit.to_dict(), "score": score, "rank": rank, "stage_scores": {**hit.stage_scores, stage: score}})


def _ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0
