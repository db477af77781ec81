"""What a pipeline stage is: one :class:`Stage` declares its settings, how its model loads and what it does to a
batch of questions; :data:`retriever.stages.STAGES` lists them in the order they run.

A stage's settings are a frozen dataclass whose fields are declared with :func:`common.settings.setting`, its switch
``on`` first. Every door (flags, HTTP fields, the demo, ``pipeline.json`` of the first format) names a field by its
flat name (:meth:`Stage.flat_name`): the stage's name for ``on``, else ``<stage>_<field>``, unless the stage lists
another in `flat_names` (``summarize`` for the rewrite stage's ``on``, ``reranker`` for the rerank stage's model).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Protocol

from medfaq.common.settings import Declared, declared_settings
from medfaq.retriever.search import Hit, Retriever
from medfaq.retriever.trained_models import SUMMARIZER_ECL_MODEL, require_trained

MAX_HITS = 100  # the most hits a question is answered with (top_k) or rescored in (a stage's depth)


@dataclass(frozen=True)
class StageLoader:
    """How a stage's object is built: ``load(model, settings)`` returns it (``load(model)`` when it `reads` no
    setting); `reads`: the flat names of the pipeline settings it reads, handed to it as `settings` (the stage cache
    keys the object by them); ``locate(name)``: the model the configured `name` means (None = the stage's default, a
    set-up model that raises `ModelNotTrained` when it is not trained yet), resolved, or a one-line
    :class:`MedfaqError` naming the fix; without it `model` is `name` as configured."""

    load: Callable[..., Any]
    reads: tuple[str, ...] = ()
    locate: Callable[[str | None], str | None] | None = None


class StageSettings:
    """The settings a stage loader declared it reads, as attributes by their flat names; reading another one is an
    error (a value the stage depends on would be missing from its cache key)."""

    def __init__(self, kind: str, values: dict[str, Any]) -> None:
        self._kind, self._values = kind, values

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name not in values:
            raise AttributeError(f"the {self._kind} stage loader reads {name!r} without declaring it in `reads`")
        return values[name]


def set_up_model(name: str | None, kind: str, default: str | None) -> str:
    """`name` (or `default`), with a one-line error naming the fix when it is a set-up model not trained yet."""
    chosen = name or default or SUMMARIZER_ECL_MODEL
    require_trained(chosen, kind)
    return chosen


def reranked(hits: list[Hit], first: int = 1) -> list[Hit]:
    """Copies of `hits` ranked in their order from `first`, their scores kept."""
    return [hit.rescored(hit.score, rank) for rank, hit in enumerate(hits, first)]


@dataclass
class Batch:
    """The questions of one :meth:`Pipeline.run_batch` as the stages read and change them: the cleaned questions,
    their summaries (None: not summarized) and entities, their ranked hits (once retrieved) and the stages'
    timings in milliseconds, summed over the batch."""

    queries: list[str]
    summaries: list[str | None]
    entities: list[list[Any]]
    hits: list[list[Hit]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


class StageRun(Protocol):
    """What a stage may ask of the pipeline running it: its config, its retriever, whether each question runs
    alone (`exact_batches`), and `timed`: a context that holds the stage's lock and adds its milliseconds to
    `timings[stage]`."""

    config: Any
    retriever: Retriever
    exact_batches: bool

    def timed(self, stage: str, timings: dict[str, float], lock: bool = True) -> AbstractContextManager[None]: ...


@dataclass(frozen=True)
class DemoSwitch:
    """A stage's switch in the demo's sidebar: its `label`, and the model (`model`) whose readiness enables it."""

    label: str
    model: str


class Stage:
    """One pipeline stage, declared once (one module each, one line in :data:`retriever.stages.STAGES`).

    `name`: the stage (the stage cache's kind, the timings' key). `settings`: its settings dataclass. `flat_names`:
    the fields whose flat name is not the rule's. `argument`: the :class:`Pipeline` keyword (and attribute) its
    object goes by; None: the stage has no object. `loader`: how that object loads; `model`: the flat name of the
    setting naming its model. `optional`: the stage runs only where its object was given (it decorates answers);
    otherwise a config that turns it on without its object is an error. `before_retrieval`: it reads the questions
    (rewrite, entities); else it acts on the hits. `rescores`: its ranking of the top :meth:`depth` hits joins the
    reranking RRF (:meth:`scores`, :meth:`weight`); `scores_top_when_sure`: where that RRF is gated off, it still
    scores the top hit (the confidence). `demo`: its switch in the demo, if it has one."""

    name: ClassVar[str]
    settings: ClassVar[type]
    flat_names: ClassVar[Mapping[str, str]] = MappingProxyType({})
    argument: ClassVar[str | None] = None
    loader: ClassVar[StageLoader | None] = None
    model: ClassVar[str | None] = None
    optional: ClassVar[bool] = False
    before_retrieval: ClassVar[bool] = False
    rescores: ClassVar[bool] = False
    scores_top_when_sure: ClassVar[bool] = False
    demo: ClassVar[DemoSwitch | None] = None

    def flat_name(self, field_name: str) -> str:
        """The name the doors know the field `field_name` of this stage's settings by."""
        default = self.name if field_name == "on" else f"{self.name}_{field_name}"
        return self.flat_names.get(field_name, default)

    @property
    def switch(self) -> str:
        """The flat name of the setting that turns the stage on."""
        return self.flat_name("on")

    def declared(self) -> dict[str, Declared]:
        """Each settings field's declaration under its flat name (so that a refusal names it as the doors do)."""
        return {
            self.flat_name(name): dataclasses.replace(declared, name=self.flat_name(name))
            for name, declared in declared_settings(self.settings).items()
        }

    def depth(self, settings: Any) -> int:
        """How many hits the stage needs retrieved (0: no more than the answer's)."""
        return 0

    def attach(self, stage_object: Any, retriever: Retriever) -> None:
        """Prepare `stage_object` for a pipeline over `retriever` (e.g. keep what it needs of the index)."""

    def run(self, stage_object: Any, settings: Any, batch: Batch, pipeline: StageRun) -> None:
        """Change `batch`: the questions' summaries or entities before retrieval, their hits after it."""

    def scores(
        self, stage_object: Any, settings: Any, query: str, summary: str | None, hits: list[Hit], pipeline: StageRun
    ) -> list[float]:
        """A rescoring stage's score of each of `hits` for the question `query` (with its `summary`)."""
        raise NotImplementedError

    def weight(self, stage_object: Any, settings: Any) -> float | None:
        """A rescoring stage's weight in the reranking RRF; None: its ranking replaces the retrieval ranking."""
        return 1.0

    def __repr__(self) -> str:
        return f"<{self.name} stage>"
