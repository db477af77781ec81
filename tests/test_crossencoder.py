"""Cross-encoder: a tiny model trained a few steps, saved and reloaded, scores the same; the reranker protocol."""

from __future__ import annotations

import numpy as np

from retriever.crossencoder import CrossEncoderReranker, train_crossencoder
from retriever.encoder_training import EncoderTrainConfig, make_config, save_trained
from retriever.pair_data import Pair
from retriever.pipeline import Reranker

PAIRS = [
    Pair("Can I drink alcohol on amoxicillin?", "Is alcohol safe with antibiotics?", 1, "g1"),
    Pair("Can I drink alcohol on amoxicillin?", "What causes migraine headaches?", 0, "g1"),
    Pair("Is shingles contagious?", "Can I catch shingles from someone?", 1, "g2"),
    Pair("Is shingles contagious?", "How is type 2 diabetes treated?", 0, "g2"),
]


def test_train_save_reload_gives_same_scores(tmp_path, tiny_bert_dir):
    config = make_config("crossencoder", "mqp", "quick", init=str(tiny_bert_dir), epochs=2, batch_size=2, lr=1e-3)
    model = train_crossencoder(PAIRS, config, device="cpu")
    before = CrossEncoderReranker(model).score_pairs([(p.text_a, p.text_b) for p in PAIRS])
    save_trained(model, config, tmp_path / "ce")

    reranker = CrossEncoderReranker.load(tmp_path / "ce", device="cpu")
    after = reranker.score_pairs([(p.text_a, p.text_b) for p in PAIRS])
    np.testing.assert_allclose(before, after, rtol=1e-5, atol=1e-6)
    assert ((after >= 0) & (after <= 1)).all()
    assert EncoderTrainConfig.load(tmp_path / "ce") == config
    assert reranker.model.max_seq_length == config.max_length


def test_reranker_protocol_and_quantized_scores(tmp_path, tiny_bert_dir):
    config = make_config("crossencoder", "mqp", "quick", init=str(tiny_bert_dir), epochs=1, batch_size=4)
    save_trained(train_crossencoder(PAIRS, config, device="cpu"), config, tmp_path / "ce")
    reranker = CrossEncoderReranker.load(tmp_path / "ce", device="cpu")
    quantized = CrossEncoderReranker.load(tmp_path / "ce", quantize=True)

    assert isinstance(reranker, Reranker)
    scores = reranker.score("Is shingles contagious?", ["Can I catch shingles?", "What is asthma?"])
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores)
    assert reranker.score("Is shingles contagious?", []) == []
    q_scores = quantized.score("Is shingles contagious?", ["Can I catch shingles?", "What is asthma?"])
    np.testing.assert_allclose(scores, q_scores, atol=0.05)
