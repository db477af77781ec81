"""A long-running search service over one index: the pipeline's stage models loaded once and shared, a Pipeline
built per request from the index's ``pipeline.json`` and the request's overrides, the index reloaded when a newer
version appears on disk, the feedback store and the experts' queue. `medfaq serve` puts it behind HTTP.

A newer index on disk that cannot be loaded (corrupted files, a half-copied directory) never takes the service down:
the version already loaded goes on serving and the fault is reported in :meth:`SearchService.status` and the log."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import medfaq.retriever.stages  # noqa: F401  (registers the summarizer, reranker and NER stage loaders)
from medfaq.app.batching import BatchSettings, MicroBatcher
from medfaq.app.feedback import Feedback, FeedbackStore
from medfaq.common.runtime import MedfaqError
from medfaq.index.faq_index import FaqIndex, disk_version
from medfaq.index.records import FaqRecord
from medfaq.retriever.pipeline import Pipeline, PipelineConfig, load_stage
from medfaq.retriever.unanswered import UnansweredLog

OVERRIDABLE = (
    "mode",
    "top_k",
    "rerank",
    "summarize",
    "abstain",
    "threshold",
    "query_source",
    "rerank_fusion",
    "rerank_margin",
)
"""PipelineConfig fields a request may set for itself."""

logger = logging.getLogger("medfaq.service")


class ServiceUnavailable(MedfaqError):
    """A fault of the server's own, not of the request (a stage model that cannot be loaded): HTTP 503."""


@dataclass
class ServiceStatus:
    """What ``GET /health`` answers: `status` is ``ok``, or ``degraded`` with the `fault` while a newer index on disk
    cannot be loaded."""

    status: Literal["ok", "degraded"]
    index: str
    faqs: int
    version: str
    encoder: str
    config: dict[str, Any]
    models: dict[str, str]
    fault: str | None = None


Settings = tuple[tuple[str, Any], ...]
"""A request's overrides, hashable: requests with equal settings are searched together."""


class SearchService:
    """Thread-safe: searches share the loaded index and stage objects (each stage runs under its own lock).

    Single questions asked at the same moment from several threads with the same settings are searched as one batch
    (`batching`, :class:`~app.batching.MicroBatcher`): one pipeline run, one vector search and one pass of each stage
    for all of them, the models taking the questions one by one (``exact_batches``), so that each caller gets
    exactly the answer its question gets alone."""

    def __init__(
        self, index_dir: str | Path, feedback_path: str | Path | None = None, batching: BatchSettings | None = None
    ) -> None:
        self.index_dir = Path(index_dir)
        self.feedback = FeedbackStore(feedback_path)
        self._guard = threading.Lock()
        self._stages: dict[tuple, Any] = {}
        self.batching = batching or BatchSettings()
        self._batcher: MicroBatcher[tuple[str, Settings], dict[str, Any]] = MicroBatcher(
            self._search_grouped, self.batching
        )
        self._failed_version: str | None = None
        self.fault: str | None = None
        self._load_index()

    def _load_index(self) -> None:
        index = FaqIndex.load(self.index_dir)
        config = PipelineConfig.load(self.index_dir)
        if config.mode != "bm25":
            index.open_encoder(config.encoder_backend)  # loaded now, never inside a request's timings
        self.index, self.config = index, config

    def refresh(self) -> bool:
        """Reload the index and its pipeline.json when a newer version is on disk; True when it reloaded. A version
        that cannot be loaded is tried once: the loaded one goes on serving, with the fault in `fault`."""
        with self._guard:
            version = disk_version(self.index_dir)
            if version is None:
                self._report(f"no index at {self.index_dir} any more; serving version {self.index.version}")
                return False
            if version in (self.index.version, self._failed_version):
                if version == self.index.version:
                    self.fault = None
                return False
            try:
                self._load_index()
            except MedfaqError as error:
                self._failed_version = version
                self._report(f"the index on disk cannot be loaded ({error}); serving version {self.index.version}")
                return False
            self._failed_version, self.fault = None, None
            return True

    def _report(self, fault: str) -> None:
        if fault != self.fault:
            logger.error(fault)
        self.fault = fault

    def pipeline(self, overrides: dict[str, Any] | None = None, exact_batches: bool = False) -> Pipeline:
        """A Pipeline for one request: the index's config with `overrides` applied as the command line's flags are
        (None values ignored; ``summarize`` alone searches with the summary); `exact_batches` as in Pipeline."""
        self.refresh()
        changes = dict(overrides or {})
        config = self.config.with_flags(changes.pop("summarize", None), changes.pop("query_source", None), **changes)
        served = {"rewrite": self.config.summarize, "rerank": self.config.rerank, "entities": self.config.entities}
        stages = {
            kind: self._stage(kind, name, config, served[kind])
            for kind, name, wanted in [
                ("rewrite", config.summarizer, config.summarize),
                ("rerank", config.reranker, config.rerank),
                ("entities", None, config.entities),
            ]
            if wanted
        }
        return Pipeline(
            self.index,
            config,
            rewriter=stages.get("rewrite"),
            reranker=stages.get("rerank"),
            entity_finder=stages.get("entities"),
            unanswered=UnansweredLog(config.unanswered_log),
            exact_batches=exact_batches,
        )

    def _stage(self, kind: str, name: str | None, config: PipelineConfig, served: bool) -> Any:
        """The cached stage object; one that cannot load is the server's fault (:class:`ServiceUnavailable`) when its
        index's pipeline.json runs it (`served`), else a refusal of the request that asked for it."""
        key = (kind, name, config.quantize, config.summary_beams, config.summary_max_length)
        with self._guard:
            if key not in self._stages:
                try:
                    self._stages[key] = load_stage(kind, name, config)
                except MedfaqError as error:
                    fault = ServiceUnavailable if served else MedfaqError
                    raise fault(f"the {kind} stage is not available on this server: {error}") from None
            return self._stages[key]

    def search(self, questions: list[str], overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """One answer per question; a single question joins the batch of those asked at the same moment."""
        if len(questions) == 1:
            return [self._batcher.submit((questions[0], tuple(sorted((overrides or {}).items()))))]
        return self._search_now(questions, overrides)

    def _search_now(
        self, questions: list[str], overrides: dict[str, Any] | None, exact: bool = False
    ) -> list[dict[str, Any]]:
        return [response.to_dict() for response in self.pipeline(overrides, exact).run_batch(questions)]

    def _search_grouped(self, asked: list[tuple[str, Settings]]) -> list[dict[str, Any] | Exception]:
        """The batch function: one pipeline run per settings; a run that fails is repeated question by question,
        so that an error reaches only the caller whose question caused it."""
        groups: dict[Settings, list[int]] = {}
        for position, (_, settings) in enumerate(asked):
            groups.setdefault(settings, []).append(position)
        outcomes: list[dict[str, Any] | Exception] = [RuntimeError("not searched")] * len(asked)
        for settings, positions in groups.items():
            questions = [asked[position][0] for position in positions]
            try:
                answers: list[dict[str, Any] | Exception] = list(self._search_now(questions, dict(settings), True))
            except Exception as error:  # noqa: BLE001  (attributed below, question by question)
                answers = [error] if len(questions) == 1 else [self._search_alone(q, dict(settings)) for q in questions]
            for position, answer in zip(positions, answers, strict=True):
                outcomes[position] = answer
        return outcomes

    def _search_alone(self, question: str, overrides: dict[str, Any]) -> dict[str, Any] | Exception:
        try:
            return self._search_now([question], overrides)[0]
        except Exception as error:  # noqa: BLE001  (raised in the thread that asked)
            return error

    def add_feedback(self, question: str, faq_id: str, helpful: bool, comment: str | None = None) -> int:
        settings = {"comment": comment} if comment else {}
        return self.feedback.add(
            Feedback(session="api", question=question, helpful=helpful, hit_ids=[faq_id], settings=settings)
        )

    def add_faqs(self, records: list[FaqRecord]) -> int:
        """Encode and add FAQs to the index on disk (under its write lock); the service then serves the new version."""
        _, added = FaqIndex.add_to(self.index_dir, records, progress=False)
        self.refresh()
        return added

    def delete_faqs(self, faq_ids: list[str]) -> int:
        _, removed = FaqIndex.delete_from(self.index_dir, faq_ids)
        self.refresh()
        return removed

    def unanswered(self) -> list[dict[str, Any]]:
        return UnansweredLog(self.config.unanswered_log).read()

    def status(self) -> ServiceStatus:
        self.refresh()
        loaded = {
            f"{kind}:{name or 'default'}": type(stage).__name__ for (kind, name, *_), stage in self._stages.items()
        }
        return ServiceStatus(
            status="degraded" if self.fault else "ok",
            index=str(self.index_dir),
            faqs=len(self.index),
            version=self.index.version,
            encoder=self.index.manifest.encoder,
            config=self.config.to_dict(),
            models=loaded,
            fault=self.fault,
        )
