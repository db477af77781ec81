"""Dense, BM25 and hybrid (reciprocal rank fusion) search over a FaqIndex, single and batch."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from medfaq.common.runtime import MedfaqError

if TYPE_CHECKING:
    import numpy as np

    from medfaq.index.faq_index import FaqIndex, ScoredIds

logger = logging.getLogger("medfaq.search")

MODES = ("dense", "bm25", "hybrid")
RRF_K = 60
MAX_QUERY_CHARS = 2000


@dataclass
class Hit:
    """One retrieved FAQ. `score` is the score of the last stage that ranked it; `stage_scores` keeps them all."""

    id: str
    score: float
    rank: int
    question: str
    answer: str = ""
    source: str = ""
    url: str = ""
    stage_scores: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def rescored(self, score: float, rank: int, stage: str | None = None) -> Hit:
        """A copy with a new score and rank, recording the score under `stage` when given."""
        scores = {**self.stage_scores, stage: score} if stage else dict(self.stage_scores)
        return Hit(**{**self.to_dict(), "score": score, "rank": rank, "stage_scores": scores})


def invalid_text_position(text: str) -> str | None:
    """Where `text` stops being valid Unicode, e.g. ``"byte 0xe9 at character 4"`` for an undecodable byte
    (Python keeps it as a lone surrogate, \\udce9) or ``"\\ud800 at character 1"`` for a lone surrogate from a
    JSON escape; None when the text is valid."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        char = text[error.start]
        code = ord(char)
        shown = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"
        return f"{shown} at character {error.start + 1}"
    return None


def check_query(query: object, name: str = "query") -> str:
    """`query` stripped; not text, empty or whitespace-only, and invalid UTF-8 are one-line errors naming it, so
    nothing downstream (the tokenizers least of all) sees such text."""
    if query is not None and not isinstance(query, str):
        raise MedfaqError(f"{name} is not text")
    text = (query or "").strip()
    if not text:
        raise MedfaqError("empty query" if name == "query" else f"{name} is empty")
    invalid = invalid_text_position(query)
    if invalid:
        raise MedfaqError(f"{name} is not valid UTF-8 ({invalid})")
    return text


def clean_queries(queries: list[str], max_chars: int = MAX_QUERY_CHARS) -> list[str]:
    """:func:`check_query` for each query; over-long ones are truncated with a warning."""
    cleaned = []
    for position, query in enumerate(queries):
        name = "query" if len(queries) == 1 else f"query {position + 1}"
        text = check_query(query, name)
        if len(text) > max_chars:
            logger.warning("%s has %d characters; truncated to %d", name, len(text), max_chars)
            text = text[:max_chars]
        cleaned.append(text)
    return cleaned


def reciprocal_rank_fusion(
    rankings: list[list[tuple[str, float]]], k: int = RRF_K, weights: list[float] | None = None
) -> list[tuple[str, float]]:
    """Fuse ranked (id, score) lists: score(id) = sum over lists of weight / (k + rank), rank starting at 1."""
    fused: dict[str, float] = {}
    for ranking, weight in zip(rankings, weights or [1.0] * len(rankings), strict=True):
        for rank, (doc_id, _) in enumerate(ranking, start=1):
            fused[doc_id] = fused.get(doc_id, 0.0) + weight / (k + rank)
    return sorted(fused.items(), key=lambda item: -item[1])


class Retriever:
    """Search a :class:`FaqIndex` in ``dense``, ``bm25`` or ``hybrid`` mode (RRF over both, `candidates` each;
    the dense list weighs `dense_weight` against BM25's 1).

    `encode_alone`: encode each query of a batch in its own encoder run, so that its vector, and its hits, are
    bit for bit those of a search of it alone (a batched run pads queries to the longest and rounds differently,
    which can swap FAQs whose cosines tie to 1e-7, e.g. duplicate questions); the vector search still takes the
    batch at once."""

    def __init__(
        self,
        index: FaqIndex,
        mode: str = "hybrid",
        candidates: int = 100,
        rrf_k: int = RRF_K,
        max_query_chars: int = MAX_QUERY_CHARS,
        dense_weight: float = 1.0,
        encode_alone: bool = False,
    ) -> None:
        self.index = index
        self.encode_alone = encode_alone
        self.dense_weight = dense_weight
        self.mode = _check_mode(mode)
        self.candidates = candidates
        self.rrf_k = rrf_k
        self.max_query_chars = max_query_chars

    @property
    def location(self) -> str | None:
        """The directory of the index searched (None: an index never saved)."""
        directory = self.index.directory
        return str(directory) if directory else None

    def bank(self) -> str:
        """What tells this index's FAQ questions apart from another's or another version's: its directory@version."""
        return f"{self.index.directory}@{self.index.version}"

    def faq_questions(self) -> list[str]:
        """The question of every FAQ of the index."""
        return [record.question for record in self.index.records()]

    def searches_concurrently(self, dense: bool) -> bool:
        """Whether concurrent searches of the index (with vectors: `dense`) may run at once rather than in turn."""
        return self.index.searches_concurrently(dense)

    def wordings(self, hit: Hit) -> list[str]:
        """The texts a reranker reads for `hit`: its FAQ question and the FAQ's phrasings (the wordings experts
        linked to it), each as the index has a reranker read it (with its concepts' other names)."""
        texts = [hit.question, *(phrasing.text for phrasing in self.index.phrasings([hit.id]))]
        return [self.index.text_for_reranking(text) for text in texts]

    def search(
        self, queries: list[str], top_k: int = 10, mode: str | None = None, allowed_ids: list[str] | None = None
    ) -> list[list[Hit]]:
        """Top-k hits per query; `allowed_ids` restricts the search to those FAQs (metadata filters)."""
        mode = _check_mode(mode or self.mode)
        if top_k < 1:
            raise MedfaqError(f"top-k must be at least 1, got {top_k}")
        queries = clean_queries(queries, self.max_query_chars)
        depth = max(top_k, self.candidates)
        stages: dict[str, ScoredIds] = {}
        if mode in {"dense", "hybrid"}:
            stages["dense"] = self._search_dense(queries, depth if mode == "hybrid" else top_k, allowed_ids)
        if mode in {"bm25", "hybrid"}:
            stages["bm25"] = self.index.search_bm25(queries, depth if mode == "hybrid" else top_k, allowed_ids)
        results = []
        for row in range(len(queries)):
            per_stage = {name: dict(ranking[row]) for name, ranking in stages.items()}
            if mode == "hybrid":
                ranked = reciprocal_rank_fusion(
                    [stages["dense"][row], stages["bm25"][row]], self.rrf_k, [self.dense_weight, 1.0]
                )
                per_stage["rrf"] = dict(ranked)
            else:
                ranked = stages[mode][row]
            results.append(
                [self._hit(doc_id, score, rank, per_stage) for rank, (doc_id, score) in enumerate(ranked[:top_k], 1)]
            )
        return results

    def _search_dense(self, queries: list[str], k: int, allowed_ids: list[str] | None) -> ScoredIds:
        return self.index.search_vectors(self._encode(queries), k, allowed_ids)

    def _encode(self, queries: list[str]) -> np.ndarray:
        """The queries' vectors by the index's encoder, each in its own run with `encode_alone`."""
        if not self.encode_alone:
            return self.index.encoder.encode(queries)
        import numpy as np

        return np.vstack([self.index.encoder.encode([query]) for query in queries])

    def cosines(self, queries: list[str], faq_ids: list[str]) -> list[float | None]:
        """Each query's cosine with the FAQ at the same position, as dense search scores that FAQ (the best of its
        vectors: its question's and its phrasings'); None where the FAQ has no vector."""
        vectors = self._encode(clean_queries(queries, self.max_query_chars))
        cosines = []
        for row, faq_id in enumerate(faq_ids):
            scored = self.index.search_vectors(vectors[row : row + 1], 1, [faq_id])[0]
            cosines.append(scored[0][1] if scored else None)
        return cosines

    def search_one(self, query: str, top_k: int = 10, mode: str | None = None) -> list[Hit]:
        return self.search([query], top_k, mode)[0]

    def beir_search(
        self, queries: dict[str, str], top_k: int = 10, mode: str | None = None
    ) -> dict[str, dict[str, float]]:
        """BEIR-style run: ``{query id: {FAQ id: score}}``."""
        query_ids = list(queries)
        hits = self.search([queries[qid] for qid in query_ids], top_k, mode)
        return {qid: {hit.id: hit.score for hit in row} for qid, row in zip(query_ids, hits, strict=True)}

    def _hit(self, doc_id: str, score: float, rank: int, per_stage: dict[str, dict[str, float]]) -> Hit:
        record = self.index.get(doc_id)
        return Hit(
            id=doc_id,
            score=score,
            rank=rank,
            question=record.question,
            answer=record.answer,
            source=record.source,
            url=record.url,
            stage_scores={name: scores[doc_id] for name, scores in per_stage.items() if doc_id in scores},
            metadata=record.metadata,
        )


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise MedfaqError(f"unknown search mode {mode!r}; choose one of {', '.join(MODES)}")
    return mode
