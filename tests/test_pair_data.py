"""Training pairs: the Quebec held-out split, MedQuAD question-answer pairs, query -> FAQ pairs with mined negatives."""

from __future__ import annotations

import json

import numpy as np
import pytest

from retriever.encoder_training import make_config
from retriever.pair_data import (
    faq_pairs,
    is_heldout,
    mine_hard_negatives,
    normalise,
    qa_pairs,
    quebec_query_split,
    task_pairs,
)


def bag_of_words(texts: list[str]) -> np.ndarray:
    """A model-free stand-in encoder: hashed bag of words, unit norm."""
    vectors = np.zeros((len(texts), 64))
    for i, text in enumerate(texts):
        for word in normalise(text).split():
            vectors[i, sum(map(ord, word)) % 64] += 1
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)


def test_quebec_split_is_deterministic_disjoint_and_about_a_fifth(shared_data):
    train, heldout = quebec_query_split(data_root=shared_data)
    assert len(train) + len(heldout) == 7060
    assert 0.17 < len(heldout) / 7060 < 0.23
    assert not {normalise(r["question"]) for r in train} & {normalise(r["question"]) for r in heldout}
    assert any(r["is_ood"] for r in heldout) and not all(r["is_ood"] for r in heldout)
    again = quebec_query_split(data_root=shared_data)[1]
    assert [r["id"] for r in again] == [r["id"] for r in heldout]
    assert is_heldout("Is it  SAFE?") == is_heldout("is it safe?")


def test_faq_pairs_use_training_queries_only_and_never_a_positive_as_negative(shared_data):
    _, heldout = quebec_query_split(data_root=shared_data)
    pairs = faq_pairs(bag_of_words, ("quebec",), n_negatives=2, max_queries=300, data_root=shared_data)
    faqs = {json.loads(line)["faq_question"] for line in (shared_data / "covid_faq/quebec_mila/faqs.jsonl").open()}
    assert {p.text_a for p in pairs}.isdisjoint({r["question"] for r in heldout})
    assert {p.text_b for p in pairs} <= faqs
    positive_of = {p.group: p.text_b for p in pairs if p.label == 1}
    assert all(p.text_b != positive_of.get(p.group) for p in pairs if p.label == 0)
    assert sum(p.label for p in pairs) < len(pairs) and len({p.group for p in pairs}) == 300


def test_mine_hard_negatives_skips_the_positive():
    pool = ["flu vaccine side effects", "flu vaccine for children", "broken arm cast"]
    groups = mine_hard_negatives(["side effects of the flu vaccine"], [pool[0]], pool, bag_of_words, 2)
    assert groups == [["flu vaccine for children", "broken arm cast"]]


def test_qa_pairs_pair_each_question_with_its_answer_and_a_same_kind_answer(tmp_path):
    rows = []
    for focus in ("asthma", "gout", "acne"):
        for qtype in ("symptoms", "treatment"):
            rows.append(
                {"id": f"{focus}-{qtype}", "question": f"What are the {qtype} of {focus}?", "qtype": qtype,
                 "focus": focus, "doc_id": focus, "answer": f"The {qtype} answer for {focus}."}
            )  # fmt: skip
    rows.append({"id": "x", "question": "Removed answer?", "qtype": "symptoms", "focus": "x", "answer": ""})
    (tmp_path / "medquad").mkdir()
    (tmp_path / "medquad" / "medquad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    pairs = qa_pairs(seed=0, data_root=tmp_path)
    positives = [p for p in pairs if p.label == 1]
    negatives = [p for p in pairs if p.label == 0]
    assert len(positives) == 6 and len(negatives) == 6
    for pair in negatives:
        qtype, focus = pair.text_a.split()[3], pair.text_a.split()[-1].rstrip("?")
        assert pair.text_b.split()[1] == qtype and focus not in pair.text_b
    assert qa_pairs(seed=0, data_root=tmp_path) == pairs


def test_task_pairs_caps_and_reports_missing_data(shared_data):
    config = make_config("crossencoder", "mqp", "quick", max_pairs=100)
    assert len(task_pairs(config, shared_data)) == 100
    with pytest.raises(Exception, match="medfaq data fetch mqp"):
        task_pairs(config)
