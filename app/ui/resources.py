"""What every page shares, created once per Streamlit server: settings, set-up runner, index, models, stores.

Each loader is cached with `st.cache_resource` under its path and file time, so a rebuilt index or a newly
trained model is picked up without restarting the server. Pipelines are cheap objects built per search around
these shared stages; the stage objects carry their own locks, so concurrent sessions search safely.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from medfaq.app.feedback import FeedbackStore
from medfaq.app.setup_state import DemoSettings, SetupRunner, model_ready, model_stamp
from medfaq.index.faq_index import FaqIndex
from medfaq.retriever.pipeline import EntityFinder, PipelineConfig, QueryRewriter, Reranker
from medfaq.retriever.stages import load_entities, load_reranker, load_rewriter


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
def faq_index(directory: str, stamp: float) -> FaqIndex:
    """The index with its query encoder loaded and warmed up, so the first search is as fast as the next."""
    index = FaqIndex.load(directory)
    index.encoder.encode(["warm-up"])
    return index


def base_config(demo: DemoSettings) -> PipelineConfig:
    """The index's saved ``pipeline.json`` (or the defaults): thresholds, depths, generation settings."""
    return PipelineConfig.load(demo.index_dir)


@st.cache_resource(show_spinner="Loading the question summarizer…")
def rewriter(path: str, stamp: float, config: str) -> QueryRewriter:
    return load_rewriter(path, PipelineConfig.from_dict(json.loads(config)))


@st.cache_resource(show_spinner="Loading the reranker…")
def reranker(path: str, stamp: float, config: str) -> Reranker:
    return load_reranker(path, PipelineConfig.from_dict(json.loads(config)))


@st.cache_resource(show_spinner="Loading the medical entity recogniser…")
def entity_finder() -> EntityFinder:
    return load_entities(None)


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


def _model(path: Path | None, loader, config: str) -> tuple[object | None, str]:
    if path is None:
        return None, "switched off"
    if not model_ready(path):
        return None, f"not available yet ({path.name})"
    try:
        return loader(str(path), model_stamp(path), config), path.name
    except Exception as error:  # a broken model must not take the page down; the stage is shown as failed
        return None, f"failed to load {path.name}: {error}"


def ready_stages(demo: DemoSettings) -> Stages:
    """Load whatever stages are ready now."""
    config = json.dumps(base_config(demo).to_dict(), sort_keys=True)
    summary, summary_note = _model(demo.summarizer, rewriter, config)
    rerank, rerank_note = _model(demo.reranker, reranker, config)
    try:
        finder = entity_finder()
        finder_note = type(finder).__name__
    except Exception as error:  # entities only decorate the summary; search works without them
        finder, finder_note = None, f"unavailable: {error}"
    notes = {"summarizer": summary_note, "reranker": rerank_note, "entities": finder_note}
    return Stages(summary, rerank, finder, notes)
