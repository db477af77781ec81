"""Training pairs: the Quebec held-out split, MedQuAD question-answer pairs, query -> FAQ pairs with mined negatives."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from medfaq.common.runtime import MedfaqError
from medfaq.retriever.training.config import make_config
from medfaq.retriever.training.loop import make_batches
from medfaq.retriever.training.pair_data import (
    faq_pairs,
    is_heldout,
    mine_hard_negatives,
    normalise,
    pair_counts,
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
    pairs = faq_pairs(bag_of_words, ("quebec",), n_negatives=2, per_source=300, data_root=shared_data)
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


def write_jsonl(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture
def faq_data(tmp_path):
    """A shared/data-like layout where evaluation questions also turn up in training splits."""
    leaked = "My son has a rash after amoxicillin, is it an allergy?"
    summaries = [
        {"chq": f"question {i} about {topic}, what should I do?", "faq": f"What is the treatment for {topic}?"}
        for i, topic in enumerate(["gout", "asthma", "acne", "eczema", "migraine", "shingles"])
    ]
    write_jsonl(tmp_path / "meqsum/train.jsonl", [*summaries[:3], {"chq": leaked, "faq": "Is it amoxicillin allergy?"}])
    write_jsonl(tmp_path / "meqsum/valid.jsonl", [summaries[3]])
    write_jsonl(tmp_path / "meqsum/test.jsonl", [{"chq": leaked, "faq": "What is amoxicillin allergy?"}])
    write_jsonl(tmp_path / "healthcaremagic/train.jsonl", [*summaries[4:], {"chq": leaked.upper(), "faq": "Rash?"}])
    rqe = [
        {"pid": "1", "chq": "Can gout come back?", "faq": "Does gout recur?", "label": 1},
        {"pid": "2", "chq": "Can gout come back?", "faq": "What causes acne?", "label": 0},
        {"pid": "3", "chq": "Is acne contagious?", "faq": "What is eczema?", "label": 0},
    ]
    write_jsonl(tmp_path / "mediqa2019_rqe/train.jsonl", rqe)
    write_jsonl(
        tmp_path / "mediqa2019_rqe/test.jsonl", [{"pid": "9", "chq": summaries[0]["chq"], "faq": "x", "label": 1}]
    )
    return tmp_path, leaked


def test_faq_pairs_never_emit_an_evaluation_question(faq_data):
    root, leaked = faq_data
    pairs = faq_pairs(bag_of_words, ("meqsum", "healthcaremagic", "rqe"), n_negatives=1, data_root=root)
    texts = {normalise(text) for pair in pairs for text in (pair.text_a, pair.text_b)}
    assert normalise(leaked) not in texts  # in meqsum test, and copied into meqsum and healthcaremagic train
    assert "question 0 about gout, what should i do?" not in texts  # an RQE test question
    assert "question 1 about asthma, what should i do?" in texts  # training questions are kept
    counts = pair_counts(pairs)
    assert counts["meqsum"] == {"queries": 2, "positives": 2, "negatives": 2}
    assert counts["healthcaremagic"]["queries"] == 2
    # RQE: the entailed FAQ is the positive and the non-entailed ones are labelled negatives
    rqe = {(p.text_a, p.text_b, p.label) for p in pairs if p.source == "rqe"}
    assert ("Can gout come back?", "Does gout recur?", 1) in rqe and (
        "Can gout come back?",
        "What causes acne?",
        0,
    ) in rqe
    assert ("Is acne contagious?", "What is eczema?", 0) in rqe
    assert not any(p.label == 1 and p.text_a == "Is acne contagious?" for p in pairs)


def test_faq_pairs_sample_each_source_to_the_cap(faq_data):
    root, _ = faq_data
    pairs = faq_pairs(bag_of_words, ("meqsum", "healthcaremagic"), n_negatives=1, per_source=1, data_root=root)
    assert {source: row["queries"] for source, row in pair_counts(pairs).items()} == {"meqsum": 1, "healthcaremagic": 1}
    assert faq_pairs(bag_of_words, ("meqsum", "healthcaremagic"), 1, 1, data_root=root) == pairs


def test_mined_negatives_drop_near_duplicates_of_the_positive():
    pool = ["flu vaccine side effects", "side effects flu vaccine", "flu vaccine for children"]
    groups = mine_hard_negatives(["flu vaccine side effects?"], [pool[0]], pool, bag_of_words, 2)
    assert groups == [["flu vaccine for children"]]  # the reworded positive is a false negative


def test_distinct_batches_keep_shared_texts_apart():
    triplets = [(f"q{i}", "faq a" if i < 4 else f"faq {i}", "faq b") for i in range(8)]
    batches = make_batches(triplets, 4, random.Random(0), distinct=lambda t: t[1:])
    assert sorted(t for batch in batches for t in batch) == sorted(triplets)
    for batch in batches:
        keys = [key for triplet in batch for key in triplet[1:]]
        assert len(keys) == len(set(keys))


def test_a_querys_other_positives_are_never_its_mined_negatives(tmp_path):
    rows = [
        {"pid": "1", "chq": "flu shot side effects and safety", "faq": "flu shot side effects", "label": 1},
        {"pid": "2", "chq": "flu shot side effects and safety", "faq": "is the flu shot safe", "label": 1},
        {"pid": "3", "chq": "broken arm cast care", "faq": "how to care for a cast", "label": 1},
        {"pid": "4", "chq": "flu shot side effects and safety", "faq": "flu shot for children", "label": 0},
    ]
    (tmp_path / "mediqa2019_rqe").mkdir()
    (tmp_path / "mediqa2019_rqe" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    pairs = faq_pairs(bag_of_words, ("rqe",), n_negatives=3, data_root=tmp_path)
    flu = [p for p in pairs if p.text_a == rows[0]["chq"]]
    positives = {p.text_b for p in flu if p.label == 1}
    assert positives == {"flu shot side effects", "is the flu shot safe"}
    assert not positives & {p.text_b for p in flu if p.label == 0}
    assert "flu shot for children" in {p.text_b for p in flu if p.label == 0}


def test_listwise_subsampling_keeps_whole_queries():
    from medfaq.retriever.training.pair_data import Pair, subsample_groups

    pairs = [Pair(f"q{g}", f"faq{g}-{i}", int(i == 0), f"g{g}") for g in range(10) for i in range(4)]
    kept = subsample_groups(pairs, 10, seed=3)
    assert len(kept) == 8  # two whole groups of 4; a third would pass the limit
    assert {p.group for p in kept} == {p.group for p in kept if p.label == 1}
    assert all(sum(p.group == g for p in kept) == 4 for g in {p.group for p in kept})
    assert subsample_groups(pairs, 10, seed=3) == kept and subsample_groups(pairs, None, seed=0) != pairs


def test_chosen_sources_and_cap_reach_the_pairs(faq_data):
    root, _ = faq_data
    config = make_config("biencoder", "faq", "quick", faq_sources=("rqe",), faq_per_source=1, negatives_encoder="x")
    assert config.faq_sources == ("rqe",) and config.faq_per_source == 1
    pairs = faq_pairs(bag_of_words, config.faq_sources, 1, config.faq_per_source, data_root=root)
    assert {pair.source for pair in pairs} == {"rqe"} and pair_counts(pairs)["rqe"]["queries"] == 1


@pytest.mark.parametrize(
    ("task", "sources", "message"),
    [
        ("faq", ("rqe", "pubmed"), "unknown training source pubmed; choose from meqsum"),
        ("faq", (), "no training source"),
        ("mqp", ("rqe",), "needs --task faq"),
    ],
)
def test_bad_sources_are_refused_in_one_line(task, sources, message):
    with pytest.raises(MedfaqError, match=message):
        make_config("biencoder", task, "quick", faq_sources=sources)


def test_a_saved_config_loads_with_the_sources_it_was_trained_on(tmp_path):
    from medfaq.retriever.training.config import EncoderTrainConfig

    make_config("crossencoder", "mqp", "quick").save(tmp_path)
    saved = json.loads((tmp_path / "train_config.json").read_text())
    saved["faq_sources"] = ["meqsum", "a-source-since-renamed"]  # an older release's default sources
    (tmp_path / "train_config.json").write_text(json.dumps(saved))
    assert EncoderTrainConfig.load(tmp_path).faq_sources == ("meqsum", "a-source-since-renamed")


def test_length_buckets_keep_distinct_batches_and_group_similar_lengths():
    short = [(f"q{i}", f"faq {i}", f"neg {i}") for i in range(64)]
    long = [("long question " * 20 + str(i), f"faq {i + 64}", f"neg {i + 64}") for i in range(64)]
    triplets = [*short, *long]
    keys = lambda t: t[1:]  # noqa: E731
    batches = make_batches(triplets, 16, random.Random(0), length=lambda t: len(t[0]), distinct=keys)
    assert sorted(t for batch in batches for t in batch) == sorted(triplets)
    assert all(len({key for t in batch for key in keys(t)}) == 2 * len(batch) for batch in batches)
    assert all(len({len(t[0]) > 50 for t in batch}) == 1 for batch in batches)  # no batch mixes short and long
    mixed = make_batches(triplets, 16, random.Random(0), distinct=keys)
    assert any(len({len(t[0]) > 50 for t in batch}) == 2 for batch in mixed)


def test_length_buckets_are_a_biencoder_setting():
    assert make_config("biencoder", "faq", "quick", length_buckets=True).length_buckets
    with pytest.raises(MedfaqError, match="always bucketed"):
        make_config("crossencoder", "faq", "quick", length_buckets=True)
