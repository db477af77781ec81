"""The summarizer's retrieval negatives: the FAQ questions dense search ranks highest for a training CHQ, false
negatives removed, mined by `medfaq train summarizer --retrieval-negatives` and appended to each pair's hard
negatives."""

from __future__ import annotations

import json

import pytest

from medfaq.index.faq_index import FaqIndex
from medfaq.index.records import FaqRecord
from medfaq.retriever.training.pair_data import retrieval_near_misses
from medfaq.summarizer.training.examples import build_examples
from tests.conftest import FAQ_ROWS, tiny_summarizer_config
from tests.test_summarizer_cli import medfaq, tiny_training
from tests.test_summarizer_training import PAIRS


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, tiny_encoder):
    directory = tmp_path_factory.mktemp("bank") / "index"
    FaqIndex.build([FaqRecord.from_dict(row) for row in FAQ_ROWS], tiny_encoder, progress=False).save(directory)
    return directory


def test_near_misses_leave_out_the_faq_and_its_near_duplicates(index_dir):
    faq = FAQ_ROWS[2]["question"]  # the gold FAQ is itself a question of the bank
    pairs = [
        ("how do you treat shingles on the back?", faq),
        ("is parkinson inherited from parents?", "Is PD genetic?"),
    ]
    rows = retrieval_near_misses(index_dir, pairs, n_negatives=3, near_duplicate=1.01)  # the FAQ itself only
    assert [row["chq"] for row in rows] == [chq for chq, _ in pairs]
    assert all(len(row["negatives"]) == 3 for row in rows)
    assert faq not in rows[0]["negatives"]
    bank = {row["question"] for row in FAQ_ROWS}
    assert all(set(row["negatives"]) <= bank for row in rows)
    encoder = FaqIndex.load(index_dir).encoder
    for row, (_, gold) in zip(retrieval_near_misses(index_dir, pairs, n_negatives=3), pairs, strict=True):
        for negative in row["negatives"]:  # the default filter: below cosine 0.9 to the FAQ
            vectors = encoder.encode([negative, gold])
            assert float(vectors[0] @ vectors[1]) < 0.9
    assert retrieval_near_misses(index_dir, pairs, 3, near_duplicate=-1.0)[0]["negatives"] == []  # all too close


def test_build_examples_appends_the_retrieval_negatives(tmp_path):
    path = tmp_path / "near.jsonl"
    path.write_text(json.dumps({"chq": PAIRS[0][0], "negatives": ["A?", "B?", "C?"]}) + "\n")
    config = tiny_summarizer_config("ecl", n_hard_negatives=0, n_retrieval_negatives=2, retrieval_negatives=str(path))
    examples = build_examples(PAIRS[:2], config)
    assert examples[0].negatives == ("A?", "B?") and examples[1].negatives == ()
    assert config.hard_slots == 2
    assert tiny_summarizer_config("mle", n_retrieval_negatives=2).hard_slots == 0  # MLE reads no negatives


def test_train_summarizer_mines_and_keeps_the_retrieval_negatives(tmp_path, tiny_bert_dir, index_dir):
    out = tmp_path / "model"
    result = tiny_training(
        tmp_path, tiny_bert_dir, "ecl", "--queue-size", 8, "--n-hard-negatives", 1, "--retrieval-negatives", 2,
        "--retrieval-index", index_dir,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "train_config.json").read_text())
    assert saved["n_retrieval_negatives"] == 2 and saved["retrieval_negatives"] == str(
        out / "retrieval_negatives.jsonl"
    )
    rows = [json.loads(line) for line in (out / "retrieval_negatives.jsonl").read_text().splitlines()]
    assert [row["chq"] for row in rows] == [chq for chq, _ in PAIRS[:4]]
    assert all(len(row["negatives"]) <= 2 for row in rows)  # the random encoder finds many near-duplicates
    again = medfaq("train", "summarizer", "--out", out, "--data-root", tmp_path / "data", "--retrieval-negatives", 1,
                   "--retrieval-index", index_dir)  # fmt: skip
    assert again.exit_code == 2 and "not empty" in again.stderr, again.output  # before any mining
    missing = medfaq("train", "summarizer", "--out", tmp_path / "m2", "--data-root", tmp_path / "data",
                     "--retrieval-negatives", 1, "--retrieval-index", tmp_path)  # fmt: skip
    assert missing.exit_code == 2 and "manifest" in missing.stderr, missing.output
