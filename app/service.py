"""A long-running search service over one index: the pipeline's stage models taken from the process's stage cache
(loaded once, shared), a Pipeline built per request from the index's ``pipeline.json`` and the request's overrides,
the index reloaded when a newer version appears on disk and the config when its ``pipeline.json`` changes, the
feedback store and the experts' queue. `medfaq serve` puts it behind HTTP.

A newer index or an edited ``pipeline.json`` on disk that cannot be loaded (corrupted files, a half-copied
directory, an invalid setting) never takes the service down: what is loaded goes on serving and the fault is
reported in :meth:`SearchService.status` and the log. The served index damaged in place (a file of it overwritten:
its records are read from disk) is reported the same way, and its searches are refused as the server's fault
(:class:`ServiceUnavailable`) until its files match their checksums again or a new version is saved."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from medfaq.app.adaptation_job import AdaptationJob
from medfaq.app.batching import BatchSettings, MicroBatcher
from medfaq.common.runtime import MedfaqError, NotFound
from medfaq.index import verified
from medfaq.index.faq_index import FaqIndex
from medfaq.index.records import FaqRecord
from medfaq.index.storage import disk_version, verify_checksums
from medfaq.retriever.decisions import likelihood_choice, reranker_choice
from medfaq.retriever.model_cache import StageError, shared_cache, wanted_stages
from medfaq.retriever.pipeline import Pipeline
from medfaq.retriever.pipeline_file import config_bytes, parse_config
from medfaq.retriever.queue.feedback import Feedback, FeedbackStore
from medfaq.retriever.queue.question_queue import QuestionQueue, open_queue
from medfaq.retriever.queue.unanswered import UnansweredLog

logger = logging.getLogger("medfaq.service")


class ServiceUnavailable(MedfaqError):
    """A fault of the server's own, not of the request (a stage model that cannot be loaded, the served index damaged
    on disk): HTTP 503."""


@dataclass
class ServiceStatus:
    """What ``GET /health`` answers: `status` is ``ok``, or ``degraded`` with the `fault` while a newer index or the
    ``pipeline.json`` on disk cannot be loaded, the index was removed or the served one is damaged on disk;
    `likelihood` and `reranker`: the index's recorded decisions on the likelihood stage (`medfaq index likelihood`)
    and the reranker (`medfaq index rerank`), None where it has none; `encoder_backend`: the runtime the query
    encoder runs on (``torch-bf16``, ``onnx``; None until it is loaded)."""

    status: Literal["ok", "degraded"]
    index: str
    faqs: int
    version: str
    encoder: str
    config: dict[str, Any]
    models: dict[str, str]
    fault: str | None = None
    likelihood: dict[str, Any] | None = None
    reranker: dict[str, Any] | None = None
    encoder_backend: str | None = None


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
        self.stages = shared_cache()
        self._guard = threading.Lock()
        self.batching = batching or BatchSettings()
        self._batcher: MicroBatcher[tuple[str, Settings], dict[str, Any]] = MicroBatcher(
            self._search_grouped, self.batching
        )
        self._failed: tuple[str, bytes | None] | None = None  # the index version and pipeline.json tried in vain
        self._queue: tuple[FaqIndex, QuestionQueue] | None = None  # opened for that index on first use
        self.fault: str | None = None
        self._damaged = False  # the served index's files on disk no longer match their checksums: searches refused
        self._matched: list[verified.Signature] | None = None  # those files' identities and times when they matched
        self._load(FaqIndex.load(self.index_dir), config_bytes(self.index_dir))
        self.adaptation = AdaptationJob(self.index_dir, on_done=self.refresh)  # `medfaq index adapt`, in the background

    def _load(self, index: FaqIndex | None, saved: bytes | None) -> None:
        """Serve the pipeline.json read as `saved` over `index` (None: the loaded one, opened again when the config
        asks for another encoder backend); the query encoder is loaded now, never inside a request's timings."""
        config = parse_config(saved, self.index_dir)
        if index is None:
            same_backend = config.encoder_backend == self.config.encoder_backend
            index = self.index if same_backend else FaqIndex.load(self.index_dir)
        self.stages.open_encoder(index, config)
        self.index, self.config, self._serving = index, config, (index.version, saved)

    def refresh(self) -> bool:
        """Reload what changed on disk: the index when a newer version is there, the config when its pipeline.json
        changed (the stage models come from the cache); True when it reloaded. A version or a pipeline.json that
        cannot be loaded is tried once: what is loaded goes on serving, with the fault in `fault`."""
        with self._guard:
            version = disk_version(self.index_dir)
            if version is None:
                self._report(f"no index at {self.index_dir} any more; serving version {self.index.version}")
                return False
            on_disk = (version, config_bytes(self.index_dir))
            if on_disk == self._serving:
                damage = self._damage()
                self._damaged = damage is not None
                if damage:
                    self._report(
                        f"the index served is damaged on disk ({damage}); searches are refused until it is "
                        "repaired or a new version is saved"
                    )
                else:
                    self.fault = None
                return False
            if on_disk == self._failed:
                return False
            newer = version != self.index.version
            try:
                self._load(FaqIndex.load(self.index_dir) if newer else None, on_disk[1])
            except MedfaqError as error:
                self._failed = on_disk
                what = "index" if newer else "pipeline config"
                self._report(
                    f"the {what} on disk cannot be loaded ({error}); serving version {self.index.version} "
                    "with the config loaded before"
                )
                return False
            self._failed, self.fault, self._damaged = None, None, False
            return True

    def _damage(self) -> str | None:
        """Why the served index's files on disk no longer match their checksums (None: they match, or a save swapped
        a newer version in meanwhile, which the next refresh loads); hashed only when a file's identity or times
        changed since they last matched."""
        checksums = self.index.manifest.checksums.items()
        try:
            stamps = [verified.signature((self.index_dir / name).stat(), checksum) for name, checksum in checksums]
        except OSError:
            stamps = None
        if stamps is not None and stamps == self._matched:
            return None
        try:
            verify_checksums(self.index_dir, self.index.manifest)
        except MedfaqError as error:
            return str(error) if disk_version(self.index_dir) == self.index.version else None
        self._matched = stamps
        return None

    def _report(self, fault: str) -> None:
        if fault != self.fault:
            logger.error(fault)
        self.fault = fault

    def pipeline(self, overrides: dict[str, Any] | None = None, exact_batches: bool = False) -> Pipeline:
        """A Pipeline for one request: the index's config with `overrides` applied as the command line's flags are
        (None values ignored; ``summarize`` alone searches with the summary); `exact_batches` as in Pipeline. A
        stage that cannot load is the server's fault (:class:`ServiceUnavailable`) when the index's pipeline.json
        runs it, else a refusal of the request that asked for it."""
        self.refresh()
        with self._guard:
            if self._damaged:
                raise ServiceUnavailable(self.fault)
            index, served = self.index, self.config
        changes = dict(overrides or {})
        config = served.with_flags(changes.pop("summarize", None), changes.pop("query_source", None), **changes)
        unanswered = UnansweredLog(config.unanswered_log)
        try:
            return self.stages.pipeline(index, config, unanswered=unanswered, exact_batches=exact_batches)
        except StageError as error:
            fault = ServiceUnavailable if error.kind in wanted_stages(served) else MedfaqError
            raise fault(f"the {error.kind} stage is not available on this server: {error}") from None

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
        """Store the answer about the served index's FAQ `faq_id` (:class:`NotFound` when it has none); a question
        whose answer did not help waits in the experts' queue too."""
        self.refresh()
        if faq_id not in self.index:
            raise NotFound(f"no FAQ {faq_id!r} in the index {self.index_dir}")
        settings = {"comment": comment} if comment else {}
        row = self.feedback.add(
            Feedback(session="api", question=question, helpful=helpful, hit_ids=[faq_id], settings=settings)
        )
        if not helpful and question.strip():
            self.queue().add(question, source="not helpful")
        return row

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

    def queue(self) -> QuestionQueue:
        """The experts' queue of the served index, with the questions logged since it was last read."""
        self.refresh()
        with self._guard:
            if self._queue is None or self._queue[0] is not self.index:
                self._queue = (self.index, open_queue(self.index, self.config))
            queue = self._queue[1]
        queue.sync()
        return queue

    def queue_groups(self, status: str | None = "waiting") -> list[dict[str, Any]]:
        return [group.to_dict() for group in self.queue().groups(status)]

    def resolve_group(self, action: str, group_id: int, **values: Any) -> dict[str, Any]:
        """An expert's `action` on a group: ``link`` (faq_id, by), ``answer`` (question, answer, by), ``undo``,
        ``split`` (question_ids), ``retitle`` (title); the index changes under its write lock and is served at
        once."""
        group = getattr(self.queue(), action)(group_id, **values)
        if action in ("link", "answer", "undo"):
            self.refresh()
        return group.to_dict()

    def merge_groups(self, group_ids: list[int]) -> dict[str, Any]:
        return self.queue().merge(group_ids).to_dict()

    def status(self) -> ServiceStatus:
        self.refresh()
        loaded = {key.label: type(stage).__name__ for key, stage in self.stages.loaded().items()}
        return ServiceStatus(
            status="degraded" if self.fault else "ok",
            index=str(self.index_dir),
            faqs=len(self.index),
            version=self.index.version,
            encoder=self.index.manifest.encoder,
            config=self.config.to_dict(),
            models=loaded,
            fault=self.fault,
            likelihood=likelihood_choice.read_choice(self.index_dir),
            reranker=reranker_choice.read_choice(self.index_dir),
            encoder_backend=self.index.loaded_encoder_backend,
        )
