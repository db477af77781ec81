"""The ``entities`` stage: the question's medical entities, shown with the answer and read by the key-term filter
(:func:`summarizer.entities.load_recognizer`: stanza when its models are on disk, else the offline dictionaries).
It only decorates answers: a pipeline given no recogniser runs without it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from medfaq.common.settings import setting
from medfaq.retriever.stages.base import Batch, Stage, StageLoader, StageRun


@runtime_checkable
class EntityFinder(Protocol):
    """Finds medical entities in a question (returned in `SearchResponse.entities`)."""

    def find(self, text: str) -> list[Any]: ...


@dataclass(frozen=True)
class EntitiesSettings:
    on: bool = setting(True, help="Find the question's medical entities.")


def load_entities(name: str | None) -> Any:
    from medfaq.summarizer.entities import load_recognizer

    return load_recognizer(name or "auto")


class EntitiesStage(Stage):
    name = "entities"
    settings = EntitiesSettings
    argument = "entity_finder"
    loader = StageLoader(load_entities)
    optional = True
    before_retrieval = True

    def run(self, finder: EntityFinder, settings: EntitiesSettings, batch: Batch, pipeline: StageRun) -> None:
        with pipeline.timed(self.name, batch.timings):
            batch.entities = [finder.find(query) for query in batch.queries]


STAGE = EntitiesStage()
