"""The ``key_terms`` stage: keep the hits that share a key term with the question (a precision bias): its entities
when any were found, else its content words (of the summary when there is one); each kept hit records the shared
fraction as ``overlap``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from medfaq.common.settings import setting
from medfaq.retriever.search import Hit
from medfaq.retriever.stages.base import Batch, Stage, StageRun, reranked

STEM_CHARS = 5  # key terms are compared on their first characters: a cheap stemmer ("diabetes" ~ "diabetic")


@dataclass(frozen=True)
class KeyTermsSettings:
    on: bool = setting(False, help="Drop hits sharing no key term with the question.")


def key_stems(texts: list[str]) -> set[str]:
    """Lower-cased content words (no stopwords) of `texts`, cut to their first `STEM_CHARS` characters."""
    from medfaq.index.bm25_store import tokenize

    return {token[:STEM_CHARS] for tokens in tokenize(texts) for token in tokens if len(token) > 2}


def shared_key_terms(query: str, summary: str | None, entities: list[Any], hits: list[Hit]) -> list[Hit]:
    """The hits sharing a key term with the question, ranked again, each with its ``overlap``."""
    entity_texts = [getattr(entity, "text", str(entity)) for entity in entities]
    terms = key_stems(entity_texts) or key_stems([summary or query])
    if not terms:
        return hits
    kept = []
    for hit in hits:
        overlap = len(terms & key_stems([hit.question])) / len(terms)
        if overlap > 0:
            hit.stage_scores["overlap"] = overlap
            kept.append(hit)
    return reranked(kept)


class KeyTermsStage(Stage):
    name = "key_terms"
    settings = KeyTermsSettings

    def run(self, stage_object: None, settings: KeyTermsSettings, batch: Batch, pipeline: StageRun) -> None:
        with pipeline.timed("filter", batch.timings, lock=False):
            rows = zip(batch.queries, batch.summaries, batch.entities, batch.hits, strict=True)
            batch.hits = [shared_key_terms(*row) for row in rows]


STAGE = KeyTermsStage()
