"""The pipeline's stages, in the order they run: one module each, one line here. Everything else is derived from
this list: :class:`~retriever.pipeline.PipelineConfig`'s nested settings and their flat names (the command line's
flags, the HTTP request's fields, the demo's switches, ``pipeline.json``), the stage cache's loaders
(:mod:`retriever.model_cache`), the evaluation's stage switches and what :class:`~retriever.pipeline.Pipeline`
runs. A stage is described in :mod:`retriever.stages.base`."""

from __future__ import annotations

from medfaq.retriever.stages import entities, key_terms, likelihood, rerank, rewrite
from medfaq.retriever.stages.base import Stage

STAGES: list[Stage] = [rewrite.STAGE, entities.STAGE, rerank.STAGE, likelihood.STAGE, key_terms.STAGE]
"""Every stage, in the order it runs: before retrieval (rewrite, entities), then on the hits."""


def stage_named(name: str) -> Stage | None:
    """The registered stage called `name` (None: there is none)."""
    return next((stage for stage in STAGES if stage.name == name), None)
