"""Other wordings of an FAQ (index/phrasings.py): searched as the FAQ, saved with the index, removed with it."""

from __future__ import annotations

import numpy as np
import pytest

from medfaq.common.runtime import MedfaqError
from medfaq.index.faq_index import FaqIndex
from medfaq.index.phrasings import PHRASINGS_FILE

ASKED = ["zzqx blorf wibble glonk", "frumious bandersnatch jubjub?"]
"""Made-up words: nothing in the index resembles them until they are linked to an FAQ."""


@pytest.fixture
def saved_index(tmp_path, faq_records, tiny_encoder):
    directory = tmp_path / "idx"
    FaqIndex.build(faq_records, tiny_encoder, progress=False).save(directory)
    return directory


def top_ids(index: FaqIndex, question: str, k: int = 6) -> tuple[list[str], list[str]]:
    dense = [faq_id for faq_id, _ in index.search_dense([question], k)[0]]
    bm25 = [faq_id for faq_id, _ in index.search_bm25([question], k)[0]]
    return dense, bm25


def test_a_linked_wording_finds_its_faq_first_and_each_faq_once(saved_index, tiny_encoder):
    index, added = FaqIndex.edit(
        saved_index,
        lambda index: index.editor().add_phrasings("f4", [*ASKED, "  ", ASKED[0].upper()], by="dr a", origin="g1"),
        encoder=tiny_encoder,
    )
    assert [p.text for p in added] == ASKED  # blank and same-wording texts skipped
    assert all(p.faq_id == "f4" and p.by == "dr a" and p.origin == "g1" and p.added for p in added)
    loaded = FaqIndex.load(saved_index, tiny_encoder)
    assert (saved_index / PHRASINGS_FILE).is_file() and loaded.manifest.counts["phrasings"] == 2
    for question in ASKED:
        dense, bm25 = top_ids(loaded, question)
        assert dense[0] == "f4" and bm25[0] == "f4"
        assert len(dense) == len(set(dense)) == 6  # the FAQ once, and still six distinct FAQs
    assert [faq_id for faq_id, _ in loaded.search_dense([ASKED[0]], 3, allowed_ids=["f4", "f1"])[0]][0] == "f4"
    assert loaded.editor().add_phrasings("f4", [ASKED[1]]) == []  # a wording it has


def test_phrasings_are_undone_by_key_and_removed_with_their_faq(saved_index, tiny_encoder):
    _, added = FaqIndex.edit(saved_index, lambda index: index.editor().add_phrasings("f4", ASKED), encoder=tiny_encoder)
    index, removed = FaqIndex.edit(saved_index, lambda index: index.editor().remove_phrasings([added[0].key]))
    assert removed == [added[0]] and [p.text for p in index.phrasings()] == [ASKED[1]]
    assert "f4" not in top_ids(FaqIndex.load(saved_index, tiny_encoder), ASKED[0])[1]  # BM25 no longer knows it
    with pytest.raises(MedfaqError, match="no phrasing with key"):
        index.editor().remove_phrasings([added[0].key])
    index, _ = FaqIndex.delete_from(saved_index, ["f4"])
    assert index.phrasings() == [] and len(index.store) == len(index.records())
    assert not (saved_index / PHRASINGS_FILE).exists()
    with pytest.raises(MedfaqError, match="no FAQ with id"):
        FaqIndex.load(saved_index, tiny_encoder).editor().add_phrasings("f4", ASKED)


def test_a_corrupt_phrasings_file_is_a_one_line_error(saved_index, tiny_encoder):
    FaqIndex.edit(saved_index, lambda index: index.editor().add_phrasings("f1", ASKED), encoder=tiny_encoder)
    (saved_index / PHRASINGS_FILE).write_text('{"key": 1}\n', encoding="utf-8")
    with pytest.raises(MedfaqError, match="corrupt"):
        FaqIndex.load(saved_index, verify=False)


def test_the_reranker_scores_an_faq_by_its_best_wording(saved_index, tiny_encoder):
    """A reranked search reads the phrasings experts linked too: the FAQ scores as its best-matching wording."""
    from medfaq.retriever.pipeline import Pipeline, PipelineConfig

    class SharedWords:
        def score(self, query: str, candidates: list[str]) -> list[float]:
            asked = set(query.lower().split())
            return [len(asked & set(c.lower().split())) / len(set(c.lower().split())) for c in candidates]

    FaqIndex.edit(saved_index, lambda index: index.editor().add_phrasings("f4", [ASKED[0]]), encoder=tiny_encoder)
    index = FaqIndex.load(saved_index, tiny_encoder)
    config = PipelineConfig(rerank=True, rerank_fusion="replace", entities=False, log_unanswered=False)
    response = Pipeline(index, config, reranker=SharedWords()).run(ASKED[0])
    assert response.hits[0].id == "f4" and response.hits[0].stage_scores["rerank"] == 1.0
    assert all(hit.stage_scores["rerank"] == 0.0 for hit in response.hits[1:])


def test_a_search_asks_only_for_the_rows_that_can_hide_k_faqs_and_still_finds_k(saved_index, tiny_encoder):
    def add_many(index):
        for n, faq_id in enumerate(["f1", "f2", "f3", "f4"]):
            index.editor().add_phrasings(
                faq_id, [f"{ASKED[0]} {word}" for word in ["a", "bb", "ccc", "dddd", "eeeee"][: n + 2]]
            )

    FaqIndex.edit(saved_index, add_many, encoder=tiny_encoder)
    index = FaqIndex.load(saved_index, tiny_encoder)
    phrasings = index.phrasings()
    assert len(phrasings) == 2 + 3 + 4 + 5
    from medfaq.index.phrasings import PhrasingTable

    table = PhrasingTable(phrasings)
    assert [table.most_of(n) for n in (0, 1, 2, 4, 9)] == [0, 5, 9, 14, 14]
    for search in (index.search_dense, index.search_bm25):
        every = search([ASKED[0]], 6)[0]  # BM25 finds only the 4 FAQs whose phrasings share its words
        assert len({faq_id for faq_id, _ in every}) == len(every) >= 4
        for k in range(1, len(every)):  # the rows of the k - 1 FAQs with most phrasings cannot hide the k-th FAQ
            found = search([ASKED[0]], k)[0]
            assert len({faq_id for faq_id, _ in found}) == k  # (tied scores may order FAQs differently)
            assert np.allclose([score for _, score in found], [score for _, score in every[:k]])
