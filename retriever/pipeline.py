"""The search pipeline: the stages before retrieval (summarize, entities) -> retrieve (raw, summary or both fused)
-> the stages on the hits (rerank and likelihood fused by one RRF, the key-term filter) -> abstain.

The stages are declared once each in :mod:`retriever.stages` (one module per stage, one ordered registry,
:data:`~retriever.stages.STAGES`); :class:`PipelineConfig` nests their settings and :class:`Pipeline` runs them in
that order. Build a :class:`Pipeline` with the stage objects (by each stage's `argument`: ``rewriter``, ``reranker``,
``likelihood``, ``entity_finder``), or let :func:`retriever.model_cache.build_pipeline` take them for a config from
the process's stage cache.

A Pipeline may be shared between threads: each stage runs under a lock belonging to its stage object (tokenizers and
some models are not re-entrant), so concurrent searches return exactly what serial ones do while different stages
still overlap; pipelines built per request around the same cached stage objects share those locks.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from medfaq.common.runtime import BACKEND_HELP, ENCODER_BACKENDS, MedfaqError
from medfaq.common.settings import Declared, check_setting, declared_settings, setting
from medfaq.retriever.queue.unanswered import UnansweredLog
from medfaq.retriever.search import MAX_QUERY_CHARS, MODES, RRF_K, Hit, Retriever, clean_queries, reciprocal_rank_fusion
from medfaq.retriever.stages import STAGES, Stage
from medfaq.retriever.stages.base import MAX_HITS, Batch, reranked
from medfaq.retriever.stages.entities import EntityFinder
from medfaq.retriever.stages.key_terms import key_stems
from medfaq.retriever.stages.likelihood import LikelihoodScorer
from medfaq.retriever.stages.rerank import RERANK_MARGIN, Reranker, corrects_first_stage
from medfaq.retriever.stages.rewrite import QueryRewriter

if TYPE_CHECKING:
    from medfaq.index.faq_index import FaqIndex

__all__ = [
    "MAX_HITS",
    "QUERY_SOURCES",
    "RERANK_MARGIN",
    "SUMMARIZED_SOURCE",
    "EntityFinder",
    "LikelihoodScorer",
    "Pipeline",
    "PipelineConfig",
    "QueryRewriter",
    "Reranker",
    "SearchResponse",
    "confidence",
    "corrects_first_stage",
    "flag_changes",
    "key_stems",
    "pipeline_settings",
    "threshold_key",
]

logger = logging.getLogger("medfaq.pipeline")

QUERY_SOURCES = ("raw", "summary", "both")
# summarizing alone (over a config searching with the raw question) searches with the question and its summary fused:
# the summary alone lost far more Recall@1 on every benchmark (docs/results.md, "Does summarizing first help?")
SUMMARIZED_SOURCE = "both"
FUSION_STAGE = "rerank"  # the stage whose settings hold the reranking RRF and its gate, which every rescorer joins


@dataclass(init=False)
class PipelineConfig:
    """What the pipeline runs; saved as ``pipeline.json`` beside an index (:mod:`retriever.pipeline_file`).

    The first stage's settings are its own fields; `stages` holds each stage's settings by its name (the dataclasses
    of :data:`retriever.stages.STAGES`, e.g. ``config.stages["rerank"].depth``). Every setting also goes by its flat
    name, the one the doors use (``rerank_depth``): the constructor, :meth:`replace`, :meth:`updated`,
    :meth:`from_dict` and attribute reads (``config.rerank_depth``) take it, and :meth:`to_dict` gives them all.
    A config is checked once, when it is built (every setting by its declaration, :func:`check_setting`); a
    :meth:`replace` checks what it changes.

    The defaults are the best configuration measured (docs/results.md, "Retrieval pipeline" and "Query -> FAQ
    training set"): raw-question dense search (over an index encoded by the fine-tuned bi-encoder once `medfaq
    setup` built one), which beat hybrid and weighted hybrid RRF on all six benchmarks; no summarizing and no
    reranking (the Gemma summaries and the quick cross-encoder both lowered Recall@1 against dense alone);
    abstention on wherever a threshold was calibrated for the configuration.

    `candidates`: hits per list before hybrid/raw+summary fusion. `quantize`: int8 dynamic quantisation of the
    summarizer and reranker. `encoder_backend`: the runtime of the query encoder (:data:`index.encoder.
    ENCODER_BACKENDS`; ``auto``: PyTorch on a GPU, ONNX Runtime on the CPU, where searching imports no torch), and of
    the reranker, which runs on ONNX Runtime wherever the encoder does, unless ``rerank_precision`` asks for bf16.
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
    stages: dict[str, Any] = field(default_factory=dict)  # the stages' settings take this place among the settings
    quantize: bool = setting(False, help="int8 dynamic quantisation of summarizer and reranker.", flag=True)
    encoder_backend: str = setting("auto", help="Query encoder. " + BACKEND_HELP, flag=True, choices=ENCODER_BACKENDS)
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

    def __init__(self, stages: Mapping[str, Any] | None = None, **settings: Any) -> None:
        """Settings by their flat (or top-level) names over `stages` (settings dataclasses by stage name; a stage
        left out takes its defaults); an unknown name, a value its declaration refuses or a query source without
        summarizing is a one-line :class:`MedfaqError`."""
        for declared in dataclasses.fields(self):
            if declared.name != "stages":
                default = declared.default
                value = declared.default_factory() if default is dataclasses.MISSING else default
                setattr(self, declared.name, value)
        given = dict(stages or {})
        unknown_stages = sorted(set(given) - {stage.name for stage in STAGES})
        if unknown_stages:
            raise MedfaqError(f"unknown pipeline stage(s): {', '.join(unknown_stages)}")
        self.stages = {stage.name: given.get(stage.name) or stage.settings() for stage in STAGES}
        self._set(settings)
        self._check(pipeline_settings())

    def _set(self, settings: Mapping[str, Any]) -> None:
        """Apply `settings`, by their flat names, to this config."""
        unknown = sorted(set(settings) - set(pipeline_settings()))
        if unknown:
            raise MedfaqError(f"unknown pipeline setting(s): {', '.join(unknown)}")
        nested = _nested_names()
        changes: dict[str, dict[str, Any]] = {}
        for name, value in settings.items():
            if name in nested:
                stage, field_name = nested[name]
                changes.setdefault(stage, {})[field_name] = value
            else:
                setattr(self, name, value)
        for stage, values in changes.items():
            self.stages[stage] = dataclasses.replace(self.stages[stage], **values)

    def _check(self, declarations: Mapping[str, Declared]) -> None:
        for name, declared in declarations.items():
            check_setting(declared, getattr(self, name))
        if self.query_source != "raw" and not self.stage("rewrite").on:
            raise MedfaqError(f"query source {self.query_source!r} needs summarize=true")
        thresholds = [*self.thresholds.values()]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in thresholds):
            raise MedfaqError(f"thresholds must be finite numbers, got {self.thresholds}")

    def __getattr__(self, name: str) -> Any:
        """A stage's setting by its flat name (``config.rerank_depth``)."""
        nested = _nested_names().get(name)
        stages = self.__dict__.get("stages")
        if nested is None or stages is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(stages[nested[0]], nested[1])

    def stage(self, name: str) -> Any:
        """The settings of the stage called `name`."""
        return self.stages[name]

    @property
    def threshold_key(self) -> str:
        """The configuration a threshold belongs to: mode x rerank x query source, e.g. ``dense+rerank@raw``."""
        return threshold_key(self.mode, self.stage("rerank").on, self.query_source)

    def threshold_keys(self) -> list[str]:
        """The configurations whose calibrated threshold this one may abstain below, first choice first: its own,
        then dense search's with the same reranking and query source."""
        dense = threshold_key("dense", self.stage("rerank").on, self.query_source)
        return list(dict.fromkeys([self.threshold_key, dense]))

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
        return self.abstain and not self.stage("rerank").on and key is not None and key != self.threshold_key

    def replace(self, **changes: Any) -> PipelineConfig:
        """A copy with `changes` (by flat name) applied as given (None included); what they change is checked."""
        changed = copy.copy(self)
        for name, value in vars(self).items():  # no dict of settings shared with this config
            if isinstance(value, dict):
                setattr(changed, name, dict(value))
        changed._set(changes)
        declarations = pipeline_settings()
        changed._check({name: declarations[name] for name in changes})
        return changed

    def to_dict(self) -> dict[str, Any]:
        """Every setting by its flat name, in the declarations' order."""
        return {name: copy.deepcopy(getattr(self, name)) for name in pipeline_settings()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PipelineConfig:
        """The config of `data`, settings by their flat names (:func:`upgraded` first)."""
        return cls(**upgraded(data))

    def updated(self, **changes: Any) -> PipelineConfig:
        """A copy with `changes` applied (None values are ignored)."""
        return self.replace(**{name: value for name, value in changes.items() if value is not None})

    def with_flags(
        self, summarize: bool | None = None, query_source: str | None = None, **changes: Any
    ) -> PipelineConfig:
        """Overrides of the command line's flags, a request's settings or the demo's switches (None = not given),
        as :func:`flag_changes` reads them."""
        return self.replace(**flag_changes(self.query_source, summarize, query_source, **changes))


def flag_changes(
    current_source: str, summarize: bool | None = None, query_source: str | None = None, **changes: Any
) -> dict[str, Any]:
    """The settings that overrides (None = not given) change, over a config searching with `current_source`:
    ``query_source`` summary or both implies summarizing, ``summarize`` alone over a raw-question config searches
    with the question and its summary fused (`SUMMARIZED_SOURCE`), ``summarize=False`` with the raw question."""
    if summarize is None and query_source not in (None, "raw"):
        summarize = True
    if summarize and query_source is None and current_source == "raw":
        query_source = SUMMARIZED_SOURCE
    if summarize is False:
        query_source = "raw"
    given = {"summarize": summarize, "query_source": query_source, **changes}
    return {name: value for name, value in given.items() if value is not None}


def upgraded(data: Mapping[str, Any]) -> dict[str, Any]:
    """Flat settings as this version reads them: a file of the one-threshold format keeps its threshold for the
    configuration it was saved with (when abstention was on; otherwise it was never calibrated and is dropped); a
    file that sets `rerank_retrieval_weight` but not `rerank_rrf_k` (saved before that setting existed) keeps the
    reranking RRF it was saved with, k = its `rrf_k`."""
    data = dict(data)
    if "rerank_retrieval_weight" in data and "rerank_rrf_k" not in data:
        data["rerank_rrf_k"] = data.get("rrf_k", RRF_K)
    if "thresholds" not in data and data.get("threshold") is not None:
        saved_with = threshold_key(
            data.get("mode", "dense"), data.get("rerank", False), data.get("query_source", "raw")
        )
        calibrated = {saved_with: data["threshold"]} if data.get("abstain", True) else {}
        data |= {"threshold": None, "thresholds": calibrated}
    return data


def pipeline_settings() -> dict[str, Declared]:
    """Every setting's declaration by its flat name, in order: the first stage's, each stage's in the order of
    :data:`retriever.stages.STAGES` (in the place of `PipelineConfig.stages`), then the rest."""
    return dict(_declarations(tuple(STAGES)))


def _nested_names() -> dict[str, tuple[str, str]]:
    """Each stage setting's flat name -> (stage, field)."""
    return _nested(tuple(STAGES))


@functools.cache
def _declarations(stages: tuple[Stage, ...]) -> tuple[tuple[str, Declared], ...]:
    top = list(declared_settings(PipelineConfig).items())
    place = [field.name for field in dataclasses.fields(PipelineConfig)].index("stages")
    nested = [item for stage in stages for item in stage.declared().items()]
    ordered = top[:place] + nested + top[place:]
    names = [name for name, _ in ordered]
    clashes = sorted({name for name in names if names.count(name) > 1})
    if clashes:
        raise ValueError(f"pipeline settings declared twice: {', '.join(clashes)}")
    return tuple(ordered)


@functools.cache
def _nested(stages: tuple[Stage, ...]) -> dict[str, tuple[str, str]]:
    return {stage.flat_name(name): (stage.name, name) for stage in stages for name in declared_settings(stage.settings)}


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


def _say_abstention_is_off(where: str, config: PipelineConfig) -> None:
    """Warn, once per process, index (`where`) and configuration, that `config` answers every question with a hit:
    it abstains, but no threshold applies to it."""
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


class Pipeline:
    """Runs the stages `config` turns on, in the registry's order, around retrieval; without them it is plain
    retrieval. The stage objects come by each stage's `argument` (``rewriter=``, ``reranker=``, ``likelihood=``,
    ``entity_finder=``) and are read back as attributes of that name (None where the stage does not run); a stage
    the config turns on without its object is an error, but for one that only decorates answers (entities).

    `exact_batches`: :meth:`run_batch` answers each question bit for bit as :meth:`run` does: the query encoder and
    the summarizer take the questions one at a time (batched model runs pad them to the longest and round
    differently), while the vector and BM25 searches and the other stages still take the batch at once."""

    def __init__(
        self,
        index: FaqIndex,
        config: PipelineConfig | None = None,
        *,
        unanswered: UnansweredLog | None = None,
        exact_batches: bool = False,
        **stage_objects: Any,
    ) -> None:
        self.config = config or PipelineConfig()
        self.exact_batches = exact_batches
        arguments = {stage.argument for stage in STAGES if stage.argument}
        unknown = sorted(set(stage_objects) - arguments)
        if unknown:
            raise TypeError(f"not a pipeline stage: {', '.join(unknown)}")
        self.retriever = Retriever(
            index,
            self.config.mode,
            self.config.candidates,
            self.config.rrf_k,
            self.config.max_query_chars,
            self.config.dense_weight,
            encode_alone=exact_batches,
        )
        self.running: list[tuple[Stage, Any, Any]] = []  # (stage, its object, its settings), in order
        for stage in STAGES:
            settings = self.config.stage(stage.name)
            stage_object = stage_objects.get(stage.argument) if stage.argument else None
            if not settings.on or (stage.optional and stage_object is None):
                continue
            if stage.argument and stage_object is None:
                raise MedfaqError(
                    f"the pipeline config turns on {stage.switch} but no {stage.name} stage was given "
                    f"(`{stage.argument}`)"
                )
            if stage_object is not None:
                stage.attach(stage_object, self.retriever)
            self.running.append((stage, stage_object, settings))
        self.unanswered = unanswered or UnansweredLog(self.config.unanswered_log)
        self._locks = {"retrieve": _lock_for(index), "confidence": _lock_for(index)}
        self._locks |= {stage.name: _lock_for(stage_object) for stage, stage_object, _ in self.running}
        if self.config.abstain and self.config.active_threshold() is None:
            _say_abstention_is_off(self.retriever.location or "this index", self.config)

    def __getattr__(self, name: str) -> Any:
        """The object of the stage whose `argument` is `name` (``pipeline.reranker``); None where it does not run."""
        if name not in {stage.argument for stage in STAGES if stage.argument}:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        running = self.__dict__.get("running", [])
        return next((stage_object for stage, stage_object, _ in running if stage.argument == name), None)

    @property
    def index(self) -> FaqIndex:
        return self.retriever.index

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
        batch = Batch(cleaned, [None] * len(cleaned), [[] for _ in cleaned])
        for stage, stage_object, settings in self.running:
            if stage.before_retrieval:
                stage.run(stage_object, settings, batch, self)
        with self.timed("retrieve", batch.timings):
            batch.hits = self._retrieve(batch.queries, batch.summaries)
        rescored = False
        for stage, stage_object, settings in self.running:
            if stage.before_retrieval or (stage.rescores and rescored):
                continue
            if stage.rescores:  # every rescoring stage at once: their rankings are fused
                rows = zip(batch.queries, batch.summaries, batch.hits, strict=True)
                batch.hits = [self.rescore(query, summary, hits, batch.timings) for query, summary, hits in rows]
                rescored = True
            else:
                stage.run(stage_object, settings, batch, self)
        confidences = [confidence(ranked) for ranked in batch.hits]
        if config.judges_by_cosine():
            with self.timed("confidence", batch.timings):
                confidences = self._top_cosines(batch.queries, batch.summaries, batch.hits)
        batch.timings["total"] = _ms_since(start)
        per_query = {name: value / len(cleaned) for name, value in batch.timings.items()}
        threshold = config.active_threshold() if config.abstain else None
        responses = []
        rows = zip(batch.queries, batch.summaries, batch.entities, batch.hits, truncated, confidences, strict=True)
        for query, summary, found, ranked, cut, sure in rows:
            abstained = not ranked or (threshold is not None and (sure is None or sure < threshold))
            response = SearchResponse(
                query, summary, found, ranked[: config.top_k], abstained, dict(per_query), sure, cut
            )
            if abstained and config.log_unanswered:
                best = ranked[0] if ranked else None
                self.unanswered.append(
                    query,
                    summary,
                    found,
                    sure,
                    best.id if best else None,
                    best.question if best else None,
                    self.retriever.location,
                )
            responses.append(response)
        return responses

    def timed(self, stage: str, timings: dict[str, float], lock: bool = True) -> _StageTimer:
        """A context that holds `stage`'s lock (but where the retriever searches concurrently, or `lock` is False)
        and adds its milliseconds to `timings[stage]`."""
        searching = stage in ("retrieve", "confidence")
        if searching and self.retriever.searches_concurrently(stage == "confidence" or self.config.mode != "bm25"):
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
        depth = max([config.top_k, *(stage.depth(settings) for stage, _, settings in self.running)])
        if config.query_source == "raw":
            return self.retriever.search(queries, depth)
        summary_hits = self.retriever.search([s or q for q, s in zip(queries, summaries, strict=True)], depth)
        if config.query_source == "summary":
            return summary_hits
        raw_hits = self.retriever.search(queries, depth)
        return [_fuse(raw, summary, depth, config.rrf_k) for raw, summary in zip(raw_hits, summary_hits, strict=True)]

    def _retrieval_is_sure(self, hits: list[Hit]) -> bool:
        """Dense search ranked its top hit clearly first: its cosine beats the second's by the reranking's margin."""
        config, margin = self.config, self.config.stage(FUSION_STAGE).margin
        if margin is None or config.mode != "dense" or config.query_source == "both" or len(hits) < 2:
            return False
        return hits[0].score - hits[1].score >= margin

    def rescore(self, query: str, summary: str | None, hits: list[Hit], timings: dict[str, float]) -> list[Hit]:
        """Rescore the top hits with every rescoring stage that runs (the cross-encoder, the summary likelihood), in
        order, each reading the question (or its `summary`), and order them by the fusion of their rankings: one
        RRF with the retrieval ranking (weights and k: the rerank stage's settings), where a stage whose ranking
        replaces the retrieval one (its weight None) takes its place."""
        rescorers = [(stage, obj, settings) for stage, obj, settings in self.running if stage.rescores]
        fusion = self.config.stage(FUSION_STAGE)
        if self._retrieval_is_sure(hits):  # retrieval's order and scores stand; a stage may score the top hit
            for stage, stage_object, settings in rescorers:
                if stage.scores_top_when_sure:
                    with self.timed(stage.name, timings):
                        scores = stage.scores(stage_object, settings, query, summary, hits[:1], self)
                    hits[0].stage_scores[stage.name] = scores[0]
            return hits
        depths = [stage.depth(settings) for stage, _, settings in rescorers]
        depth = max(depths, default=0)
        head, tail = hits[:depth], hits[depth:]
        if not head:
            return hits
        by_id = {hit.id: hit for hit in head}
        base = [(hit.id, hit.score) for hit in head]  # the retrieval ranking
        rankings: list[tuple[list[tuple[str, float]], float]] = []  # (a stage's ranking, its RRF weight)
        for (stage, stage_object, settings), stage_depth in zip(rescorers, depths, strict=True):
            with self.timed(stage.name, timings):
                scores = stage.scores(stage_object, settings, query, summary, head[:stage_depth], self)
            ranking = _scored(by_id, head[:stage_depth], scores, stage.name)
            weight = stage.weight(stage_object, settings)
            if weight is None:
                base = ranking + base[stage_depth:]
            else:
                rankings.append((ranking, weight))
        if rankings:
            weights = [fusion.retrieval_weight, *(weight for _, weight in rankings)]
            lists = [base, *(ranking for ranking, _ in rankings)]
            fused = f"{rescorers[0][0].name}_rrf"
            ordered = [
                by_id[doc_id].rescored(score, 0, fused)
                for doc_id, score in reciprocal_rank_fusion(lists, fusion.rrf_k, weights)
            ]
        else:  # the replacing stage's order alone
            ordered = [by_id[doc_id].rescored(score, 0) for doc_id, score in base]
        return reranked(ordered) + reranked(tail, len(head) + 1)


def _scored(by_id: dict[str, Hit], hits: list[Hit], scores: list[float], stage: str) -> list[tuple[str, float]]:
    """Record each hit's `stage` score in `by_id`; the hits' ranking by it, best first."""
    for hit, score in zip(hits, scores, strict=True):
        by_id[hit.id] = by_id[hit.id].rescored(float(score), by_id[hit.id].rank, stage)
    return sorted(((hit.id, float(score)) for hit, score in zip(hits, scores, strict=True)), key=lambda r: -r[1])


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
        hit = by_id[doc_id].rescored(score, rank, "fusion")
        hit.stage_scores.update(extra.get(doc_id, {}))
        fused.append(hit)
    return fused


def _ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0
