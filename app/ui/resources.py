"""What every page shares, created once per Streamlit server: settings, set-up runner, index, models, stores.

The index is cached with `st.cache_resource` under its path and file time, the stage models in the process's stage
cache (:mod:`retriever.model_cache`) under their files, so a rebuilt index or a newly trained model is picked up
without restarting the server. Pipelines are cheap objects built per search around these shared stages; the stage
objects carry their own locks, so concurrent sessions search safely.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from medfaq.app.setup_state import DemoSettings, SetupRunner, model_ready
from medfaq.index.faq_index import FaqIndex
from medfaq.retriever.model_cache import shared_cache
from medfaq.retriever.pipeline import EntityFinder, PipelineConfig, QueryRewriter, Reranker
from medfaq.retriever.pipeline_file import read_config
from medfaq.retriever.queue.feedback import FeedbackStore
from medfaq.retriever.queue.question_queue import QuestionQueue, open_queue

LOADING = {
    "rewrite": "Loading the question summarizer…",
    "rerank": "Loading the reranker…",
    "entities": "Loading the medical entity recogniser…",
}


@st.cache_resource
def settings() -> DemoSettings:
    return DemoSettings.from_env()


@st.cache_resource
def setup_runner(demo: DemoSettings) -> SetupRunner:
    """The server's set-up runner, started on first use."""
    runner = SetupRunner(demo)
    runner.start()
    return runner


@st.cache_resource(show_spinner="Loading the FAQ index…")
def faq_index(directory: str, stamp: float, backend: str) -> FaqIndex:
    """The index with its query encoder loaded on `backend` and warmed up, so the first search is as fast as the
    next."""
    index = FaqIndex.load(directory)
    index.open_encoder(backend).encode(["warm-up"])
    return index


def base_config(demo: DemoSettings) -> PipelineConfig:
    """The index's saved ``pipeline.json`` (or the defaults): thresholds, depths, generation settings; with the
    demo's summarizer and reranker as its models."""
    models = {"summarizer": demo.summarizer, "reranker": demo.reranker}
    return read_config(demo.index_dir).updated(**{k: str(v) for k, v in models.items() if v is not None})


@st.cache_resource
def feedback_store() -> FeedbackStore:
    return FeedbackStore()


@dataclass
class Stages:
    """The loaded stages (None where a model is not ready) and one line per stage for the page."""

    rewriter: QueryRewriter | None
    reranker: Reranker | None
    entity_finder: EntityFinder | None
    notes: dict[str, str]


def _stage(kind: str, path: Path | None, config: PipelineConfig) -> tuple[object | None, str]:
    if path is None:
        return None, "switched off"
    if not model_ready(path):
        return None, f"not available yet ({path.name})"
    try:
        with st.spinner(LOADING[kind]):
            return shared_cache().stage(kind, str(path), config), path.name
    except Exception as error:  # a broken model must not take the page down; the stage is shown as failed
        return None, f"failed to load {path.name}: {error}"


def ready_stages(demo: DemoSettings) -> Stages:
    """Load whatever stages are ready now."""
    config = base_config(demo)
    summary, summary_note = _stage("rewrite", demo.summarizer, config)
    rerank, rerank_note = _stage("rerank", demo.reranker, config)
    try:
        with st.spinner(LOADING["entities"]):
            finder = shared_cache().stage("entities", None, config)
        finder_note = type(finder).__name__
    except Exception as error:  # entities only decorate the summary; search works without them
        finder, finder_note = None, f"unavailable: {error}"
    notes = {"summarizer": summary_note, "reranker": rerank_note, "entities": finder_note}
    return Stages(summary, rerank, finder, notes)


def expert_queue() -> QuestionQueue:
    """The experts' queue of the demo's index (grouped with its encoder, titled by the demo's summarizer when it
    loads; its answers go to that index), with the questions logged since it was last read."""
    demo = settings()
    config = base_config(demo)
    index = faq_index(str(demo.index_dir), demo.index_stamp(), config.encoder_backend)
    queue = open_queue(index, config)
    queue.sync()
    return queue
