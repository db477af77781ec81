"""A long-running search service over one index: the pipeline's stage models loaded once and shared, a Pipeline
built per request from the index's ``pipeline.json`` and the request's overrides, the index reloaded when a newer
version appears on disk, the feedback store and the experts' queue. `medfaq serve` puts it behind HTTP."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import retriever.stages  # noqa: F401  (registers the summarizer, reranker and NER stage loaders)
from app.feedback import Feedback, FeedbackStore
from index.faq_index import FaqIndex, disk_version
from index.records import FaqRecord
from retriever.pipeline import Pipeline, PipelineConfig, load_stage
from retriever.unanswered import UnansweredLog

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


@dataclass
class ServiceStatus:
    index: str
    faqs: int
    version: str
    encoder: str
    config: dict[str, Any]
    models: dict[str, str]


class SearchService:
    """Thread-safe: searches share the loaded index and stage objects (each stage runs under its own lock)."""

    def __init__(self, index_dir: str | Path, feedback_path: str | Path | None = None) -> None:
        self.index_dir = Path(index_dir)
        self.feedback = FeedbackStore(feedback_path)
        self._guard = threading.Lock()
        self._stages: dict[tuple, Any] = {}
        self._load_index()

    def _load_index(self) -> None:
        index = FaqIndex.load(self.index_dir)
        config = PipelineConfig.load(self.index_dir)
        if config.mode != "bm25":
            index.open_encoder(config.encoder_backend)  # loaded now, never inside a request's timings
        self.index, self.config = index, config

    def refresh(self) -> bool:
        """Reload the index and its pipeline.json when a newer version is on disk; True when it reloaded."""
        with self._guard:
            if disk_version(self.index_dir) in (None, self.index.version):
                return False
            self._load_index()
            return True

    def pipeline(self, overrides: dict[str, Any] | None = None) -> Pipeline:
        """A Pipeline for one request: the index's config with `overrides` applied as the command line's flags are
        (None values ignored; ``summarize`` alone searches with the summary)."""
        self.refresh()
        changes = dict(overrides or {})
        config = self.config.with_flags(changes.pop("summarize", None), changes.pop("query_source", None), **changes)
        return Pipeline(
            self.index,
            config,
            rewriter=self._stage("rewrite", config.summarizer, config) if config.summarize else None,
            reranker=self._stage("rerank", config.reranker, config) if config.rerank else None,
            entity_finder=self._stage("entities", None, config) if config.entities else None,
            unanswered=UnansweredLog(config.unanswered_log),
        )

    def _stage(self, kind: str, name: str | None, config: PipelineConfig) -> Any:
        key = (kind, name, config.quantize, config.summary_beams, config.summary_max_length)
        with self._guard:
            if key not in self._stages:
                self._stages[key] = load_stage(kind, name, config)
            return self._stages[key]

    def search(self, questions: list[str], overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return [response.to_dict() for response in self.pipeline(overrides).run_batch(questions)]

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
            index=str(self.index_dir),
            faqs=len(self.index),
            version=self.index.version,
            encoder=self.index.manifest.encoder,
            config=self.config.to_dict(),
            models=loaded,
        )
