"""The loaded pipeline stages, shared: one :class:`StageCache` turns a :class:`PipelineConfig` into the stage objects it
runs (the summarizer of the ``rewrite`` stage, the cross-encoder of ``rerank``, the recogniser of ``entities``) and
opens the index's query encoder, for the command line, the server and the demo alike.

A stage's object is built by the loader the stage declares (:attr:`retriever.stages.base.Stage.loader`, read from
the registry :data:`retriever.stages.STAGES`, so every process building a pipeline has every stage;
:func:`register_stage_loader` replaces one) and cached under a :class:`StageKey` made of

* the loader;
* the model it reads, as the loader's `locate` resolves the configured name (None = its default, e.g. the best
  summarizer trained so far), and that directory's :func:`model_stamp`: a retrained model is a new stage (the one it
  replaces is dropped from the cache), a better default model trained meanwhile is picked up by the next call;
* the settings the loader declared it reads, with their values. The loader is handed those and nothing else
  (:class:`StageSettings`), so that no setting it reads can be missing from the key.

The cache is thread-safe: a stage is loaded once however many threads ask for it at the same moment, while other
stages load beside it. Pipelines built around the same cached objects share their stage locks (:class:`Pipeline`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medfaq.common.runtime import MedfaqError
from medfaq.retriever.pipeline import Pipeline, PipelineConfig, pipeline_settings
from medfaq.retriever.stages import STAGES, stage_named
from medfaq.retriever.stages.base import StageLoader, StageSettings

if TYPE_CHECKING:
    from medfaq.index.faq_index import FaqIndex

Stamp = tuple[tuple[str, int, int], ...]


class StageError(MedfaqError):
    """A stage that cannot be loaded, in the loader's one line; `kind` is the stage's."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


_STAGE_LOADERS: dict[str, StageLoader] = {stage.name: stage.loader for stage in STAGES if stage.loader}


def register_stage_loader(
    kind: str,
    load: Callable[..., Any],
    *,
    reads: tuple[str, ...] = (),
    locate: Callable[[str | None], str | None] | None = None,
) -> None:
    """Let the cache build the objects of the stage `kind` with `load` (see :class:`StageLoader`)."""
    if stage_named(kind) is None:
        raise ValueError(f"unknown stage kind {kind!r}")
    unknown = sorted(set(reads) - set(pipeline_settings()))
    if unknown:
        raise ValueError(f"the {kind} stage loader reads unknown pipeline setting(s): {', '.join(unknown)}")
    _STAGE_LOADERS[kind] = StageLoader(load, tuple(reads), locate)


def model_stamp(location: str | None) -> Stamp | None:
    """What tells the files of the model directory `location` apart from a retrained or re-saved model: the name,
    size and modification time of each file at its top level (exports and conversions made on first use live in
    subdirectories; their lock files and dotfiles are skipped). None for a hub id, or no model."""
    if location is None or not Path(location).is_dir():
        return None
    stamp = []
    with os.scandir(location) as entries:
        for entry in entries:
            if entry.name.startswith(".") or entry.name.endswith(".lock") or not entry.is_file():
                continue
            stat = entry.stat()
            stamp.append((entry.name, stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(stamp))


@dataclass(frozen=True)
class StageKey:
    """What a cached stage was built from: equal keys, the same stage object."""

    kind: str
    loader: StageLoader
    model: str | None
    stamp: Stamp | None
    settings: tuple[tuple[str, Any], ...]

    @property
    def label(self) -> str:
        """e.g. ``rerank:/home/me/.medfaq/models/reranker-correction-quick``."""
        return f"{self.kind}:{self.model or 'default'}"


def wanted_stages(config: PipelineConfig) -> dict[str, str | None]:
    """The stages with an object that `config` runs, with the model each is configured with (None = the loader's
    default)."""
    return {
        stage.name: getattr(config, stage.model) if stage.model else None
        for stage in STAGES
        if stage.argument and config.stage(stage.name).on
    }


def stage_models(config: PipelineConfig) -> list[str]:
    """The model each stage `config` runs loads, located as its loader locates it (the default one where the config
    names none); a model that cannot be located is its loader's one-line error."""
    located = []
    for kind, name in wanted_stages(config).items():
        loader = _STAGE_LOADERS.get(kind)
        if loader is not None and loader.locate is not None:
            located.append(loader.locate(name))
    return [location for location in located if location is not None]


class StageCache:
    """Stage objects by :class:`StageKey`; see the module's description."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._stages: dict[StageKey, Any] = {}
        self._loading: dict[StageKey, threading.Lock] = {}

    def key(self, kind: str, name: str | None, config: PipelineConfig) -> StageKey:
        """The key of the `kind` stage with the model `name` for `config`; a :class:`StageError` when no loader is
        registered for `kind` or the model is not there."""
        loader = _STAGE_LOADERS.get(kind)
        if loader is None:
            raise StageError(kind, f"no {kind} stage is available in this installation")
        try:
            model = loader.locate(name) if loader.locate else name
        except MedfaqError as error:
            raise StageError(kind, str(error)) from error
        settings = tuple((field, getattr(config, field)) for field in loader.reads)
        return StageKey(kind, loader, model, model_stamp(model), settings)

    def stage(self, kind: str, name: str | None, config: PipelineConfig) -> Any:
        """The `kind` stage with the model `name` (None = the loader's default) for `config`, loaded on the first
        call for its key; threads asking at the same moment wait for that one load. One that cannot be loaded is a
        :class:`StageError` (asked again, it is tried again)."""
        key = self.key(kind, name, config)
        with self._guard:
            if key in self._stages:
                return self._stages[key]
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:
            with self._guard:
                if key in self._stages:
                    return self._stages[key]
            stage = self._load(key)
            with self._guard:
                lineage = replace(key, stamp=None)
                for older in [k for k in self._stages if replace(k, stamp=None) == lineage]:
                    del self._stages[older]  # the files it was loaded from changed: pipelines in flight keep it
                self._stages[key] = stage
                self._loading.pop(key, None)
        return stage

    @staticmethod
    def _load(key: StageKey) -> Any:
        load = key.loader.load
        try:
            if not key.loader.reads:
                return load(key.model)
            return load(key.model, StageSettings(key.kind, dict(key.settings)))
        except MedfaqError as error:
            raise StageError(key.kind, str(error)) from error

    def stages(self, config: PipelineConfig) -> dict[str, Any]:
        """The stage objects `config` runs, by kind; a stage that only decorates answers (`optional`, the entity
        finder) is left out where no loader is registered for it."""
        wanted = {
            kind: name
            for kind, name in wanted_stages(config).items()
            if kind in _STAGE_LOADERS or not stage_named(kind).optional
        }
        return {kind: self.stage(kind, name, config) for kind, name in wanted.items()}

    def pipeline(self, index: FaqIndex, config: PipelineConfig, **options: Any) -> Pipeline:
        """A :class:`Pipeline` over `index` running `config` with the cached stages (`options`: the Pipeline's
        other arguments). The stages load first, so that a wrong model fails before the index's query encoder
        loads; the encoder is then opened (:meth:`open_encoder`), so that no search's timings count loading it."""
        stages = self.stages(config)
        self.open_encoder(index, config)
        arguments = {stage.name: stage.argument for stage in STAGES}
        return Pipeline(index, config, **{arguments[kind]: stage for kind, stage in stages.items()}, **options)

    @staticmethod
    def open_encoder(index: FaqIndex, config: PipelineConfig) -> None:
        """Load `index`'s query encoder on the config's backend when the config's mode searches vectors, or its
        abstention judges the top FAQ by its cosine (an index keeps the encoder it opened first)."""
        if config.mode != "bm25" or config.judges_by_cosine():
            index.open_encoder(config.encoder_backend)

    def optional_stages(
        self, config: PipelineConfig, kinds: tuple[str, ...] | None = None
    ) -> tuple[dict[str, Any], list[str]]:
        """The stages of `kinds` (None: every stage with a model) for a comparison of configurations, as
        :class:`Pipeline` arguments (``rewriter``, ``reranker``, ...), each None when it cannot be loaded, with the
        reason (``<kind>: <error>``)."""
        stages: dict[str, Any] = {}
        missing: list[str] = []
        for kind in kinds if kinds is not None else [stage.name for stage in STAGES if stage.model]:
            stage = stage_named(kind)
            try:
                stages[stage.argument] = self.stage(kind, getattr(config, stage.model) if stage.model else None, config)
            except StageError as error:
                stages[stage.argument] = None
                missing.append(f"{kind}: {error}")
        return stages, missing

    def loaded(self) -> dict[StageKey, Any]:
        """The stages loaded so far, by key."""
        with self._guard:
            return dict(self._stages)

    def clear(self) -> None:
        with self._guard:
            self._stages.clear()


_SHARED = StageCache()


def shared_cache() -> StageCache:
    """The process's stage cache, which the command line, the server and the demo take their stages from."""
    return _SHARED


def build_pipeline(index: FaqIndex, config: PipelineConfig | None = None) -> Pipeline:
    """A pipeline running `config` over `index` with the stages it names, from the process's stage cache
    (:meth:`StageCache.pipeline`: the stages load first, then the index's encoder when the mode searches vectors,
    so that no search's `timings_ms` counts loading a model)."""
    return shared_cache().pipeline(index, config or PipelineConfig())


def open_pipeline(directory: str | Path, config: PipelineConfig | None = None) -> Pipeline:
    """The index in `directory` with its saved ``pipeline.json`` (or `config`), ready to search."""
    from medfaq.index.faq_index import FaqIndex
    from medfaq.retriever.pipeline_file import read_config

    return build_pipeline(FaqIndex.load(directory), config or read_config(directory))
