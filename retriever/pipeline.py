"""The search pipeline: summarize -> retrieve (raw, summary or both fused) -> rerank the top N -> filter -> abstain.

Stages are small protocols, so the components (the ECL summarizer, the cross-encoder, the NER) plug in without
callers changing: build a :class:`Pipeline` with the stage objects, or let
:func:`retriever.model_cache.build_pipeline` take them for a :class:`PipelineConfig` from the process's stage cache
(whose loaders, declared in ``retriever.stages``, build them).

A Pipeline may be shared between threads: each stage runs under a lock belonging to its stage object (tokenizers and
some models are not re-entrant), so concurrent searches return exactly what serial ones do while different stages
still overlap; pipelines built per request around the same cached stage objects share those locks.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from medfaq.common.runtime import BACKEND_HELP, ENCODER_BACKENDS, PRECISION_HELP, PRECISIONS, MedfaqError
from medfaq.common.settings import Declared, check_setting, declared_settings, setting
from medfaq.retriever.queue.unanswered import UnansweredLog
from medfaq.retriever.search import MAX_QUERY_CHARS, MODES, RRF_K, Hit, Retriever, clean_queries, reciprocal_rank_fusion

if TYPE_CHECKING:
    from medfaq.index.faq_index import FaqIndex

logger = logging.getLogger("medfaq.pipeline")

QUERY_SOURCES = ("raw", "summary", "both")
RERANK_QUERIES = ("auto", "raw", "summary")
RERANK_FUSIONS = ("auto", "replace", "rrf")
RERANK_MARGIN = 0.05  # the dense-margin gate chosen on development queries (`PipelineConfig.rerank_margin`)
STAGE_KINDS = ("rewrite", "rerank", "likelihood", "entities")
STEM_CHARS = 5  # key terms are compared on their first characters: a cheap stemmer ("diabetes" ~ "diabetic")
MAX_HITS = 100  # the most hits a question is answered with (top_k) or rescored in (rerank_depth, likelihood_depth)
# summarizing alone (over a config searching with the raw question) searches with the question and its summary fused:
# the summary alone lost far more Recall@1 on every benchmark (docs/results.md, "Does summarizing first help?")
SUMMARIZED_SOURCE = "both"


@runtime_checkable
class QueryRewriter(Protocol):
    """Turns consumer questions into short FAQ-style questions (e.g. the ECL summarizer)."""

    def rewrite(self, texts: list[str]) -> list[str]: ...


@runtime_checkable
class Reranker(Protocol):
    """Scores (query, candidate question) pairs; higher is a better match (e.g. a cross-encoder)."""

    def score(self, query: str, candidates: list[str]) -> list[float]: ...


@runtime_checkable
class LikelihoodScorer(Protocol):
    """How likely a summarizer finds each candidate FAQ question as the summary of the query, corrected by
    `prior_weight` x its likelihood given no query, per token or summed (summarizer/likelihood.py)."""

    def score(self, query: str, candidates: list[str], prior_weight: float, per_token: bool) -> list[float]: ...


def corrects_first_stage(reranker: Reranker | None) -> bool:
    """Whether `reranker`'s scores already contain the first stage's (a reranker trained as a correction of the
    bi-encoder, ``--prior-scale``): ordering by them alone then keeps what the first stage knew."""
    return bool(getattr(reranker, "corrects_first_stage", False))


@runtime_checkable
class EntityFinder(Protocol):
    """Finds medical entities in a question (returned in `SearchResponse.entities`)."""

    def find(self, text: str) -> list[Any]: ...


@dataclass
class PipelineConfig:
    """What the pipeline runs; saved as ``pipeline.json`` beside an index (:mod:`retriever.pipeline_file`).

    The defaults are the best configuration measured (docs/results.md, "Retrieval pipeline" and "Query -> FAQ
    training set"): raw-question dense search (over an index encoded by the fine-tuned bi-encoder once `medfaq
    setup` built one), which beat hybrid and weighted hybrid RRF on all six benchmarks; no summarizing and no
    reranking (the Gemma summaries and the quick cross-encoder both lowered Recall@1 against dense alone);
    abstention on wherever a threshold was calibrated for the configuration.

    `summary_beams` / `summary_max_length`: generation settings (None = those the summarizer was validated with).
    `candidates`: hits per list before hybrid/raw+summary fusion. `rerank_depth`: how many fused hits the
    cross-encoder rescores (the rest keep their order below them). `rerank_max_length`: tokens of each
    (question, FAQ) pair the cross-encoder reads, the question cut first (None = the length it was trained with).
    `rerank_query`: what the cross-encoder reads, ``auto`` = the summary when the search used the summary alone,
    else the question. `rerank_fusion`: ``replace`` orders the rescored hits by the cross-encoder alone, ``rrf`` by
    RRF of their retrieval and cross-encoder ranks (a weak reranker then cannot bury a strong retrieval hit; with the
    reranker `medfaq setup` trains it lowered Recall@1 least, where ``replace`` lost meqsum questions with two seeds),
    ``auto`` replace for a reranker trained as a correction of the bi-encoder (its scores contain the cosine),
    else rrf. `rerank_retrieval_weight` and `rerank_rrf_k`: weight of the retrieval ranking against the
    cross-encoder ranking's 1 in that RRF, and its constant k (3 and 10: chosen on development queries as the fusion
    that lost none of their questions at rank 1, docs/results.md). `rerank_margin`: rerank only the questions
    dense search is unsure of, those whose top two cosines differ by less than this; for the others the retrieval
    order stands and the cross-encoder scores the top hit alone (for the confidence). None: rerank every question.
    It applies to dense search over one query source (other first stages score on other scales);
    `RERANK_MARGIN` (0.05) kept development queries' Recall@1 while reranking a fifth of them (docs/results.md).
    `likelihood`: score the top `likelihood_depth` hits by how likely the summarizer (`summarizer`) finds each FAQ
    question as the summary of the raw question, less `likelihood_prior` x its likelihood given no question, per
    token with `likelihood_per_token` (summarizer/likelihood.py); that ranking joins the reranking RRF with weight
    `likelihood_weight` (the retrieval ranking weighs `rerank_retrieval_weight`, the cross-encoder's 1, constant
    `rerank_rrf_k`), behind the same `rerank_margin` gate. The confidence stays on its scale: the top hit's cosine
    (or cross-encoder score), so calibrated thresholds still hold.
    `quantize`: int8 dynamic quantisation of the summarizer and reranker. `rerank_precision`: the cross-encoder's
    matrix products, ``fp32``, ``bf16`` or ``auto`` (bf16 where this machine measures it faster, e.g. AMX CPUs).
    `encoder_backend`: the runtime of the query encoder (:data:`index.encoder.ENCODER_BACKENDS`; ``auto``: PyTorch on
    a GPU, ONNX Runtime on the CPU, where searching imports no torch), and of the reranker, which runs on ONNX
    Runtime wherever the encoder does, unless `rerank_precision` asks for bf16 (``onnx-int8`` names the encoder's
    graph; the reranker's int8 graph is `quantize`'s).
    `key_terms`: drop hits sharing no key term (entities, else content words) with the query (precision bias).
    `dense_weight`: weight of the dense list against BM25's 1 in hybrid RRF.
    `abstain`: abstain when the confidence (:func:`confidence`) is below the threshold of the configuration that
    runs: `threshold` when given (a command-line override), else `thresholds[threshold_key]`, calibrated per
    configuration (mode x rerank x query source) by ``medfaq eval retrieval --save-threshold``, or inherited from
    the model that encoded the index (its ``threshold.json``, :mod:`retriever.threshold_files`;
    `inherited_thresholds` names the file each inherited one came from, and a threshold calibrated on the index
    replaces it). A BM25 or hybrid search with no threshold of its own abstains below dense search's threshold of
    the same reranking and query source, judging its top FAQ on that threshold's scale (:meth:`abstention_key`); a
    configuration with neither answers every question. Abstained questions are appended to `unanswered_log`
    (default ``$MEDFAQ_HOME/unanswered.jsonl``) when `log_unanswered`.
    """

    mode: str = setting("dense", help="Retrieval mode.", flag=True, choices=MODES, request=True)
    top_k: int = setting(10, help="Number of results.", flag=True, ge=1, le=MAX_HITS, request=True)
    candidates: int = setting(50, help="Hits per list before hybrid or raw+summary fusion.", ge=1)
    query_source: str = setting(
        "raw",
        help="Search with the raw question, its summary or both fused (summary and both imply summarize).",
        flag=True,
        aliases=("--query",),
        choices=QUERY_SOURCES,
        request=True,
    )
    summarize: bool = setting(
        False,
        help="Summarize the question first; set alone, search with the question and its summary fused.",
        flag=True,
        request=True,
    )
    summarizer: str | None = setting(
        None, help="Summarizer model (directory or name under $MEDFAQ_HOME/models).", flag=True
    )
    summary_beams: int | None = setting(
        None, help="Summarizer beams (1 = greedy).", flag=True, aliases=("--beams",), ge=1
    )
    summary_max_length: int | None = setting(None, help="Summarizer's longest summary, in tokens.", ge=1)
    rerank: bool = setting(False, help="Rerank the top hits with a cross-encoder.", flag=True, request=True)
    reranker: str | None = setting(
        None, help="Cross-encoder model (directory or name under $MEDFAQ_HOME/models).", flag=True
    )
    rerank_depth: int = setting(
        20, help="How many top hits the cross-encoder rescores.", flag=True, ge=1, le=MAX_HITS, request=True
    )
    rerank_max_length: int | None = setting(
        None, help="Tokens per (question, FAQ) pair the cross-encoder reads.", flag=True, ge=8
    )
    rerank_query: str = setting(
        "auto",
        help="What the cross-encoder reads (auto: the summary when the search used it alone).",
        choices=RERANK_QUERIES,
    )
    rerank_fusion: str = setting(
        "rrf",
        help="replace: order by the cross-encoder; rrf: RRF of retrieval and cross-encoder ranks; auto: replace for "
        "a reranker trained with --prior-scale, else rrf.",
        flag=True,
        choices=RERANK_FUSIONS,
        request=True,
    )
    rerank_retrieval_weight: float = setting(3.0, help="Weight of the retrieval ranking in the reranking RRF.", gt=0)
    rerank_rrf_k: int = setting(10, help="The constant k of the reranking RRF.", ge=0)
    rerank_margin: float | None = setting(
        None,
        help="Rerank (cross-encoder and likelihood) only questions whose top two dense cosines differ by less than "
        "this (e.g. 0.05); default: all.",
        flag=True,
        ge=0,
        request=True,
    )
    rerank_precision: str = setting(
        "fp32", help="The cross-encoder's arithmetic: " + PRECISION_HELP, flag=True, choices=PRECISIONS
    )
    likelihood: bool = setting(
        False,
        help="Rerank the top hits by how likely the summarizer finds each FAQ question as the question's summary.",
        flag=True,
        request=True,
    )
    likelihood_depth: int = setting(
        10, help="How many top hits the summary likelihood scores.", flag=True, ge=1, le=MAX_HITS, request=True
    )
    likelihood_prior: float = setting(1.0, help="Weight of an FAQ question's likelihood given no question.", ge=0)
    likelihood_per_token: bool = setting(True, help="Score the likelihood per token (else summed).")
    likelihood_weight: float = setting(1.0, help="Weight of the likelihood ranking in the reranking RRF.", gt=0)
    likelihood_vocabulary: str = setting(
        "bank",
        help="Tokens a decoder-only summarizer's likelihood normalises over: bank (those of the index's FAQ questions, "
        "the full softmax restricted and renormalised: far cheaper) or full.",
        choices=("bank", "full"),
    )
    likelihood_precision: str = setting(
        "auto", help="The likelihood stage's arithmetic: " + PRECISION_HELP, choices=PRECISIONS
    )
    quantize: bool = setting(False, help="int8 dynamic quantisation of summarizer and reranker.", flag=True)
    encoder_backend: str = setting("auto", help="Query encoder. " + BACKEND_HELP, flag=True, choices=ENCODER_BACKENDS)
    entities: bool = setting(True, help="Find the question's medical entities.")
    key_terms: bool = setting(False, help="Drop hits sharing no key term with the question.")
    dense_weight: float = setting(1.0, help="Weight of the dense list against BM25's 1 in hybrid RRF.", gt=0)
    abstain: bool = setting(
        True,
        help="Abstain (and log the question) below the threshold.",
        flag=True,
        request=True,
        needs_key=True,
    )
    threshold: float | None = setting(
        None,
        help="Abstain when the confidence is below this (a finite number).",
        flag=True,
        request=True,
        needs_key=True,
    )
    thresholds: dict[str, float] = setting(
        default_factory=dict, help="The calibrated threshold of each configuration (mode x rerank x query source)."
    )
    inherited_thresholds: dict[str, str] = setting(
        default_factory=dict, help="The threshold.json each threshold inherited from a model came from."
    )
    log_unanswered: bool = setting(True, help="Append abstained questions to the unanswered log.")
    unanswered_log: str | None = setting(None, help="The unanswered log (default: $MEDFAQ_HOME/unanswered.jsonl).")
    max_query_chars: int = setting(MAX_QUERY_CHARS, help="Questions are cut to this many characters.", ge=1)
    rrf_k: int = setting(RRF_K, help="The constant k of hybrid and raw+summary RRF.", ge=0)

    def __post_init__(self) -> None:
        for declared in pipeline_settings().values():
            check_setting(declared, getattr(self, declared.name))
        if self.query_source != "raw" and not self.summarize:
            raise MedfaqError(f"query source {self.query_source!r} needs summarize=true")
        thresholds = [*self.thresholds.values()]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in thresholds):
            raise MedfaqError(f"thresholds must be finite numbers, got {self.thresholds}")

    @property
    def threshold_key(self) -> str:
        """The configuration a threshold belongs to: mode x rerank x query source, e.g. ``dense+rerank@raw``."""
        return threshold_key(self.mode, self.rerank, self.query_source)

    def threshold_keys(self) -> list[str]:
        """The configurations whose calibrated threshold this one may abstain below, first choice first: its own,
        then dense search's with the same reranking and query source."""
        return list(dict.fromkeys([self.threshold_key, threshold_key("dense", self.rerank, self.query_source)]))

    def abstention_key(self) -> str | None:
        """The configuration whose confidence scale this one abstains on: its own with the override (`threshold`),
        else the first of :meth:`threshold_keys` with a calibrated threshold, else None (no threshold: every
        question is answered). A BM25 or hybrid search judged on dense search's threshold judges its top FAQ by its
        cosine with the question (:meth:`judges_by_cosine`), or, reranked, by its cross-encoder score: the scales
        that threshold was calibrated on."""
        if self.threshold is not None:
            return self.threshold_key
        return next((key for key in self.threshold_keys() if key in self.thresholds), None)

    def active_threshold(self) -> float | None:
        """The threshold this configuration abstains below: the override, else the calibrated one of
        :meth:`abstention_key` (or None)."""
        if self.threshold is not None:
            return self.threshold
        key = self.abstention_key()
        return None if key is None else self.thresholds[key]

    def judges_by_cosine(self) -> bool:
        """Whether this configuration abstains by its top FAQ's dense cosine with the question, which its own
        search need not have computed: a BM25 or hybrid search without a reranker, judged on dense search's
        threshold."""
        key = self.abstention_key()
        return self.abstain and not self.rerank and key is not None and key != self.threshold_key

    def replace(self, **changes: Any) -> PipelineConfig:
        """A copy with `changes` applied as given (None included), validated again."""
        return PipelineConfig.from_dict({**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PipelineConfig:
        """Validated settings; a file of the one-threshold format keeps its threshold for the configuration it was
        saved with (when abstention was on; otherwise it was never calibrated and is dropped); a file that sets
        `rerank_retrieval_weight` but not `rerank_rrf_k` (saved before that setting existed) keeps the reranking RRF
        it was saved with, k = its `rrf_k`."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise MedfaqError(f"unknown pipeline setting(s): {', '.join(unknown)}")
        if "rerank_retrieval_weight" in data and "rerank_rrf_k" not in data:
            data = {**data, "rerank_rrf_k": data.get("rrf_k", RRF_K)}
        if "thresholds" not in data and data.get("threshold") is not None:
            legacy = cls(**{**data, "threshold": None})
            calibrated = {legacy.threshold_key: float(data["threshold"])} if legacy.abstain else {}
            return cls(**{**data, "threshold": None, "thresholds": calibrated})
        return cls(**data)

    def updated(self, **changes: Any) -> PipelineConfig:
        """A copy with `changes` applied (None values are ignored), validated again."""
        return PipelineConfig.from_dict({**self.to_dict(), **{k: v for k, v in changes.items() if v is not None}})

    def with_flags(
        self, summarize: bool | None = None, query_source: str | None = None, **changes: Any
    ) -> PipelineConfig:
        """Overrides of the command line's flags, a request's settings or the demo's switches (None = not given):
        ``query_source`` summary or both implies summarizing, ``summarize`` alone over a raw-question config searches
        with the question and its summary fused (`SUMMARIZED_SOURCE`), ``summarize=False`` with the raw question."""
        if summarize is None and query_source not in (None, "raw"):
            summarize = True
        if summarize and query_source is None and self.query_source == "raw":
            query_source = SUMMARIZED_SOURCE
        if summarize is False:
            query_source = "raw"
        return self.updated(summarize=summarize, query_source=query_source, **changes)


def pipeline_settings() -> dict[str, Declared]:
    """Every :class:`PipelineConfig` field's declaration, in the class's order."""
    return declared_settings(PipelineConfig)


@dataclass
class SearchResponse:
    """Everything one question produced: the summary used, entities, ranked hits, the abstain decision and the
    confidence it was based on, per-stage timings in milliseconds, and whether the question was cut to the
    configured `max_query_chars` before it was searched."""

    query: str
    summary: str | None
    entities: list[Any]
    hits: list[Hit]
    abstained: bool
    timings_ms: dict[str, float] = field(default_factory=dict)
    confidence: float | None = None
    truncated: bool = False

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["entities"] = [asdict(e) if hasattr(e, "__dataclass_fields__") else e for e in self.entities]
        return data


_STAGE_LOCKS: dict[int, threading.Lock] = {}
_STAGE_LOCKS_GUARD = threading.Lock()


def _lock_for(stage: Any) -> threading.Lock:
    """The lock of a stage object, shared by every Pipeline using that object (so pipelines built per request
    around cached models stay thread-safe)."""
    with _STAGE_LOCKS_GUARD:
        return _STAGE_LOCKS.setdefault(id(stage), threading.Lock())


_SAID_OFF: set[tuple[str, str]] = set()


def _say_abstention_is_off(index: FaqIndex, config: PipelineConfig) -> None:
    """Warn, once per process, index and configuration, that `config` answers every question with a hit: it
    abstains, but no threshold applies to it."""
    where = str(index.directory or "this index")
    if (where, config.threshold_key) in _SAID_OFF:
        return
    _SAID_OFF.add((where, config.threshold_key))
    logger.warning(
        "abstention is off: %s has no threshold for %s, so every question with a hit is answered (calibrate one "
        "with `medfaq eval retrieval --save-threshold`)",
        where,
        " nor ".join(config.threshold_keys()),
    )


def threshold_key(mode: str, rerank: bool, query_source: str) -> str:
    """``<mode>[+rerank]@<query source>``: the configurations whose confidences share a scale."""
    return f"{mode}{'+rerank' if rerank else ''}@{query_source}"


def confidence(hits: list[Hit]) -> float | None:
    """How sure the pipeline is of its answer: the top hit's score from the last scoring stage that ran (rank
    fusions only reorder): its cross-encoder score when reranked, else its dense cosine (the better of question and
    summary), else its BM25 score. None without hits, or when a dense search ran but its top hit came from BM25
    alone (the dense search did not find it: least confident)."""
    if not hits:
        return None
    top = hits[0].stage_scores
    if "rerank" in top:
        return top["rerank"]
    dense = [value for name, value in top.items() if name.endswith("dense")]
    if dense:
        return max(dense)
    if any(name.endswith("dense") for hit in hits for name in hit.stage_scores):
        return None
    return top.get("bm25", top.get("summary_bm25", hits[0].score))


def key_stems(texts: list[str]) -> set[str]:
    """Lower-cased content words (no stopwords) of `texts`, cut to their first `STEM_CHARS` characters."""
    from medfaq.index.bm25_store import tokenize

    return {token[:STEM_CHARS] for tokens in tokenize(texts) for token in tokens if len(token) > 2}


class Pipeline:
    """Runs the configured stages for each question; without rewrite/rerank stages it is plain retrieval.

    `exact_batches`: :meth:`run_batch` answers each question bit for bit as :meth:`run` does: the query encoder and
    the summarizer take the questions one at a time (batched model runs pad them to the longest and round
    differently), while the vector and BM25 searches and the other stages still take the batch at once."""

    def __init__(
        self,
        index: FaqIndex,
        config: PipelineConfig | None = None,
        rewriter: QueryRewriter | None = None,
        reranker: Reranker | None = None,
        entity_finder: EntityFinder | None = None,
        unanswered: UnansweredLog | None = None,
        exact_batches: bool = False,
        likelihood: LikelihoodScorer | None = None,
    ) -> None:
        self.config = config or PipelineConfig()
        self.exact_batches = exact_batches
        if self.config.summarize and rewriter is None:
            raise MedfaqError("the pipeline config asks for summarization but no query-rewrite stage was given")
        if self.config.rerank and reranker is None:
            raise MedfaqError("the pipeline config asks for reranking but no rerank stage was given")
        if self.config.likelihood and likelihood is None:
            raise MedfaqError("the pipeline config asks for summary likelihood but no likelihood stage was given")
        self.index = index
        self.rewriter = rewriter if self.config.summarize else None
        self.reranker = reranker if self.config.rerank else None
        self.likelihood = likelihood if self.config.likelihood else None
        if self.likelihood is not None and hasattr(self.likelihood, "keep_bank"):  # trimmed to this bank
            bank = f"{index.directory}@{index.version}"
            self.likelihood.keep_bank(bank, lambda: [record.question for record in index.records()])
        self.entity_finder = entity_finder if self.config.entities else None
        self.unanswered = unanswered or UnansweredLog(self.config.unanswered_log)
        self.retriever = Retriever(
            index,
            self.config.mode,
            self.config.candidates,
            self.config.rrf_k,
            self.config.max_query_chars,
            self.config.dense_weight,
            encode_alone=exact_batches,
        )
        stage_objects = {
            "rewrite": rewriter,
            "entities": entity_finder,
            "retrieve": index,
            "confidence": index,
            "rerank": reranker,
            "likelihood": likelihood,
        }
        self._locks = {name: _lock_for(obj) for name, obj in stage_objects.items()}
        if self.config.abstain and self.config.active_threshold() is None:
            _say_abstention_is_off(index, self.config)

    def run(self, query: str) -> SearchResponse:
        return self.run_batch([query])[0]

    def run_batch(self, queries: list[str]) -> list[SearchResponse]:
        """One :class:`SearchResponse` per question, in order; timings are the batch's per-question average. A
        question without a single hit is abstained on (and logged) whatever the threshold."""
        if not queries:
            return []
        config = self.config
        start = time.perf_counter()
        cleaned = clean_queries(queries, config.max_query_chars)
        truncated = [len(clean) < len(query.strip()) for clean, query in zip(cleaned, queries, strict=True)]
        queries = cleaned
        timings: dict[str, float] = {}
        summaries: list[str | None] = [None] * len(queries)
        if self.rewriter is not None:
            with self._timed("rewrite", timings):
                summaries = [s.strip() or q for q, s in zip(queries, self._rewrite(queries), strict=True)]
        entities: list[list[Any]] = [[] for _ in queries]
        if self.entity_finder is not None:
            with self._timed("entities", timings):
                entities = [self.entity_finder.find(q) for q in queries]
        with self._timed("retrieve", timings):
            hits = self._retrieve(queries, summaries)
        if self.reranker is not None or self.likelihood is not None:
            rows = zip(queries, summaries, hits, strict=True)
            hits = [self.rescore(q, self._rerank_text(q, s), h, timings) for q, s, h in rows]
        if config.key_terms:
            with self._timed("filter", timings, lock=False):
                rows = zip(queries, summaries, entities, hits, strict=True)
                hits = [self._key_term_filter(q, s, e, h) for q, s, e, h in rows]
        confidences = [confidence(ranked) for ranked in hits]
        if config.judges_by_cosine():
            with self._timed("confidence", timings):
                confidences = self._top_cosines(queries, summaries, hits)
        timings["total"] = _ms_since(start)
        per_query = {name: value / len(queries) for name, value in timings.items()}
        threshold = config.active_threshold() if config.abstain else None
        responses = []
        rows = zip(queries, summaries, entities, hits, truncated, confidences, strict=True)
        for query, summary, found, ranked, cut, sure in rows:
            abstained = not ranked or (threshold is not None and (sure is None or sure < threshold))
            response = SearchResponse(
                query, summary, found, ranked[: config.top_k], abstained, dict(per_query), sure, cut
            )
            if abstained and config.log_unanswered:
                best = ranked[0] if ranked else None
                searched = str(self.index.directory) if self.index.directory else None
                self.unanswered.append(
                    query, summary, found, sure, best.id if best else None, best.question if best else None, searched
                )
            responses.append(response)
        return responses

    def _rewrite(self, queries: list[str]) -> list[str]:
        if self.exact_batches:
            return [summary for query in queries for summary in self.rewriter.rewrite([query])]
        return self.rewriter.rewrite(queries)

    def _timed(self, stage: str, timings: dict[str, float], lock: bool = True) -> _StageTimer:
        searching = stage in ("retrieve", "confidence")
        if searching and self.index.searches_concurrently(stage == "confidence" or self.config.mode != "bm25"):
            lock = False  # e.g. ONNX Runtime and FAISS on CPU: concurrent batches use every core
        return _StageTimer(stage, timings, self._locks[stage] if lock else None)

    def _top_cosines(
        self, queries: list[str], summaries: list[str | None], hits: list[list[Hit]]
    ) -> list[float | None]:
        """Each question's confidence on dense search's scale: its top FAQ's cosine with what the search read (the
        question, its summary, or the better of both), the dense search's where it found that FAQ (as
        :func:`confidence` takes it), else scored now; None without hits."""
        source = self.config.query_source
        cosines: list[float | None] = []
        texts, faq_ids, owners = [], [], []
        for row, (query, summary, ranked) in enumerate(zip(queries, summaries, hits, strict=True)):
            top = ranked[0].stage_scores if ranked else {}
            found = [value for name, value in top.items() if name.endswith("dense")]
            cosines.append(max(found) if found else None)
            if ranked and not found:
                read = [query] * (source != "summary") + [summary or query] * (source != "raw")
                texts += read
                faq_ids += [ranked[0].id] * len(read)
                owners += [row] * len(read)
        for row, cosine in zip(owners, self.retriever.cosines(texts, faq_ids) if texts else [], strict=True):
            if cosine is not None:
                cosines[row] = cosine if cosines[row] is None else max(cosines[row], cosine)
        return cosines

    def _retrieve(self, queries: list[str], summaries: list[str | None]) -> list[list[Hit]]:
        config = self.config
        depth = max(
            config.top_k,
            config.rerank_depth if self.reranker is not None else 0,
            config.likelihood_depth if self.likelihood is not None else 0,
        )
        if config.query_source == "raw":
            return self.retriever.search(queries, depth)
        summary_hits = self.retriever.search([s or q for q, s in zip(queries, summaries, strict=True)], depth)
        if config.query_source == "summary":
            return summary_hits
        raw_hits = self.retriever.search(queries, depth)
        return [_fuse(raw, summary, depth, config.rrf_k) for raw, summary in zip(raw_hits, summary_hits, strict=True)]

    def _rerank_text(self, query: str, summary: str | None) -> str:
        wanted = self.config.rerank_query
        if wanted == "auto":
            wanted = "summary" if summary and self.config.query_source == "summary" else "raw"
        return (summary or query) if wanted == "summary" else query

    def _rerank_fusion(self) -> str:
        fusion = self.config.rerank_fusion
        if fusion == "auto":
            return "replace" if corrects_first_stage(self.reranker) else "rrf"
        return fusion

    def _rerank_scores(self, query: str, hits: list[Hit]) -> list[float]:
        """The cross-encoder's score of each hit: of its FAQ question, or of the best of its phrasings (the wordings
        experts linked to it) where one scores higher; all in one call."""
        owners, texts = [], []
        for row, hit in enumerate(hits):
            wordings = [hit.question, *(phrasing.text for phrasing in self.index.phrasings([hit.id]))]
            owners += [row] * len(wordings)
            texts += [self.index.text_for_reranking(text) for text in wordings]
        best = [float("-inf")] * len(hits)
        for row, score in zip(owners, self.reranker.score(query, texts), strict=True):
            best[row] = max(best[row], float(score))
        return best

    def _retrieval_is_sure(self, hits: list[Hit]) -> bool:
        """Dense search ranked its top hit clearly first: its cosine beats the second's by `rerank_margin`."""
        config = self.config
        if config.rerank_margin is None or config.mode != "dense" or config.query_source == "both" or len(hits) < 2:
            return False
        return hits[0].score - hits[1].score >= config.rerank_margin

    def rescore(self, query: str, rerank_text: str, hits: list[Hit], timings: dict[str, float]) -> list[Hit]:
        """Rescore the top hits with the cross-encoder (reading `rerank_text`) and the summary likelihood (of the
        raw `query`), whichever run, and order them by the configured fusion of their rankings."""
        config = self.config
        if self._retrieval_is_sure(hits):  # dense order and scores stand; the top hit's rerank score: the confidence
            if self.reranker is not None:
                with self._timed("rerank", timings):
                    hits[0].stage_scores["rerank"] = self._rerank_scores(rerank_text, hits[:1])[0]
            return hits
        rerank_depth = config.rerank_depth if self.reranker is not None else 0
        likelihood_depth = config.likelihood_depth if self.likelihood is not None else 0
        depth = max(rerank_depth, likelihood_depth)
        head, tail = hits[:depth], hits[depth:]
        if not head:
            return hits
        by_id = {hit.id: hit for hit in head}
        base = [(hit.id, hit.score) for hit in head]  # the retrieval ranking
        rankings: list[tuple[list[tuple[str, float]], float]] = []  # (a model's ranking, its RRF weight)
        if rerank_depth:
            with self._timed("rerank", timings):
                scores = self._rerank_scores(rerank_text, head[:rerank_depth])
            ranking = self._scored(by_id, head[:rerank_depth], scores, "rerank")
            if self._rerank_fusion() == "replace":
                base = ranking + base[rerank_depth:]
            else:
                rankings.append((ranking, 1.0))
        if likelihood_depth:
            with self._timed("likelihood", timings):
                questions = [hit.question for hit in head[:likelihood_depth]]
                scores = self.likelihood.score(query, questions, config.likelihood_prior, config.likelihood_per_token)
            rankings.append(
                (self._scored(by_id, head[:likelihood_depth], scores, "likelihood"), config.likelihood_weight)
            )
        if rankings:
            weights = [config.rerank_retrieval_weight, *(weight for _, weight in rankings)]
            lists = [base, *(ranking for ranking, _ in rankings)]
            stage = "rerank_rrf" if rerank_depth else "likelihood_rrf"
            ordered = [
                _rescored(by_id[doc_id], score, 0, stage)
                for doc_id, score in reciprocal_rank_fusion(lists, config.rerank_rrf_k, weights)
            ]
        else:  # the cross-encoder's order alone
            ordered = [_rescored(by_id[doc_id], score, 0, None) for doc_id, score in base]
        reranked = [_rescored(hit, hit.score, rank, None) for rank, hit in enumerate(ordered, 1)]
        return reranked + [_rescored(hit, hit.score, rank, None) for rank, hit in enumerate(tail, len(head) + 1)]

    @staticmethod
    def _scored(by_id: dict[str, Hit], hits: list[Hit], scores: list[float], stage: str) -> list[tuple[str, float]]:
        """Record each hit's `stage` score in `by_id`; the hits' ranking by it, best first."""
        for hit, score in zip(hits, scores, strict=True):
            by_id[hit.id] = _rescored(by_id[hit.id], float(score), by_id[hit.id].rank, stage)
        return sorted(((hit.id, float(score)) for hit, score in zip(hits, scores, strict=True)), key=lambda r: -r[1])

    def _key_term_filter(self, query: str, summary: str | None, entities: list[Any], hits: list[Hit]) -> list[Hit]:
        """Keep hits sharing a key term with the question: its entities when any were found, else its content
        words (of the summary when there is one); each kept hit records the shared fraction as ``overlap``."""
        entity_texts = [getattr(e, "text", str(e)) for e in entities]
        terms = key_stems(entity_texts) or key_stems([summary or query])
        if not terms:
            return hits
        kept = []
        for hit in hits:
            overlap = len(terms & key_stems([hit.question])) / len(terms)
            if overlap > 0:
                hit.stage_scores["overlap"] = overlap
                kept.append(hit)
        return [_rescored(hit, hit.score, rank, None) for rank, hit in enumerate(kept, 1)]


class _StageTimer:
    """Context manager: holds the stage's lock (if any) and adds the elapsed milliseconds to `timings[stage]`."""

    def __init__(self, stage: str, timings: dict[str, float], lock: threading.Lock | None) -> None:
        self.stage, self.timings, self.lock = stage, timings, lock

    def __enter__(self) -> None:
        if self.lock is not None:
            self.lock.acquire()
        self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.timings[self.stage] = self.timings.get(self.stage, 0.0) + _ms_since(self.start)
        if self.lock is not None:
            self.lock.release()


def _fuse(raw: list[Hit], summary: list[Hit], depth: int, rrf_k: int) -> list[Hit]:
    """RRF of the raw-question and summary rankings; summary-side stage scores are kept as ``summary_<stage>``."""
    by_id = {hit.id: hit for hit in raw}
    extra: dict[str, dict[str, float]] = {}
    for hit in summary:
        by_id.setdefault(hit.id, Hit(**{**hit.to_dict(), "stage_scores": {}}))
        extra[hit.id] = {f"summary_{name}": value for name, value in hit.stage_scores.items()}
    ranking = reciprocal_rank_fusion([[(h.id, h.score) for h in raw], [(h.id, h.score) for h in summary]], rrf_k)
    fused = []
    for rank, (doc_id, score) in enumerate(ranking[:depth], 1):
        hit = _rescored(by_id[doc_id], score, rank, "fusion")
        hit.stage_scores.update(extra.get(doc_id, {}))
        fused.append(hit)
    return fused


def _rescored(hit: Hit, score: float, rank: int, stage: str | None) -> Hit:
    """A copy of `hit` with a new score and rank, recording the score under `stage` when given."""
    scores = {**hit.stage_scores, stage: score} if stage else dict(hit.stage_scores)
    return Hit(**{**hit.to_dict(), "score": score, "rank": rank, "stage_scores": scores})


def _ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0
