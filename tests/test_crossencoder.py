"""Cross-encoder: seeded training repeats, both pair orders, query-side truncation, balanced batches, best-epoch
selection, save/reload, the reranker protocol."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medfaq.common.runtime import MedfaqError
from medfaq.retriever.pipeline import Reranker
from medfaq.retriever.reranker.model import CrossEncoderReranker, SegmentCosine, load_crossencoder, truncate_first
from medfaq.retriever.reranker.training import both_orders, mean_reciprocal_rank, train_crossencoder
from medfaq.retriever.training.config import EncoderTrainConfig, make_config
from medfaq.retriever.training.loop import make_batches, train_loop
from medfaq.retriever.training.pair_data import Pair, ranking_groups
from medfaq.retriever.training.pair_models import save_trained

PAIRS = [
    Pair("Can I drink alcohol on amoxicillin?", "Is alcohol safe with antibiotics?", 1, "g1"),
    Pair("Can I drink alcohol on amoxicillin?", "What causes migraine headaches?", 0, "g1"),
    Pair("Is shingles contagious?", "Can I catch shingles from someone?", 1, "g2"),
    Pair("Is shingles contagious?", "How is type 2 diabetes treated?", 0, "g2"),
]
TEXTS = [(p.text_a, p.text_b) for p in PAIRS]


def _config(tiny_bert_dir, **overrides) -> EncoderTrainConfig:
    settings = {"init": str(tiny_bert_dir), "epochs": 2, "batch_size": 2, "lr": 1e-3, "dev_fraction": 0.0}
    settings["prior_scale"] = 0.0  # the preset's MPNet prior is tested with a tiny one below
    return make_config("crossencoder", "mqp", "quick", **{**settings, **overrides})


@pytest.mark.parametrize("head", ["cosine", "pooler"])
def test_train_save_reload_gives_same_scores(tmp_path, tiny_bert_dir, head):
    config = _config(tiny_bert_dir, head=head)
    model = train_crossencoder(PAIRS, config, device="cpu")
    before = CrossEncoderReranker(model, symmetric=config.symmetric).score_pairs(TEXTS)
    save_trained(model, config, tmp_path / "ce")

    reranker = CrossEncoderReranker.load(tmp_path / "ce", device="cpu")
    after = reranker.score_pairs(TEXTS)
    np.testing.assert_allclose(before, after, rtol=1e-5, atol=1e-6)
    assert ((after >= 0) & (after <= 1)).all() and reranker.decision_boundary == 0.5  # a probability's boundary
    assert EncoderTrainConfig.load(tmp_path / "ce") == config
    assert config.max_length is not None and reranker.model.max_seq_length == config.max_length
    assert reranker.symmetric
    if head == "cosine":  # older saved models name their head class by the module it was in then
        modules = tmp_path / "ce" / "modules.json"
        saved = modules.read_text()
        assert '"medfaq.retriever.reranker.model.SegmentCosine"' in saved
        for older_path in ("medfaq.retriever.crossencoder.", "retriever.crossencoder."):
            modules.write_text(saved.replace('"medfaq.retriever.reranker.model.', f'"{older_path}'))
            older = CrossEncoderReranker.load(tmp_path / "ce", device="cpu").score_pairs(TEXTS)
            np.testing.assert_allclose(older, after, rtol=1e-5, atol=1e-6)


def test_keep_ratio_moves_every_weight_back_towards_the_start(tiny_bert_dir):
    states = {
        ratio: train_crossencoder(PAIRS, _config(tiny_bert_dir, keep_ratio=ratio), device="cpu").state_dict()
        for ratio in (1.0, 0.5)
    }
    start = load_crossencoder(str(tiny_bert_dir), "cpu", head="cosine").state_dict()
    encoder = [name for name in start if name.startswith("0.") and start[name].is_floating_point()]
    changed = [name for name in encoder if not start[name].equal(states[1.0][name])]
    assert changed
    for name in encoder:  # half of the change kept: the start is 2 x (ratio 0.5) - (ratio 1)
        torch.testing.assert_close(2 * states[0.5][name] - states[1.0][name], start[name])
    for name in ("1.scale", "1.shift"):  # the cosine head too, from its calibrated start
        assert not states[0.5][name].equal(states[1.0][name])


@pytest.mark.parametrize("head", ["cosine", "mean", "cls", "pooler"])
def test_same_seed_same_scores_other_seed_other_scores(tiny_bert_dir, head):
    def scores(seed: int) -> np.ndarray:
        model = train_crossencoder(PAIRS, _config(tiny_bert_dir, seed=seed, head=head), device="cpu")
        return CrossEncoderReranker(model).score_pairs(TEXTS)

    first = scores(1)
    np.testing.assert_array_equal(first, scores(1))
    assert not np.allclose(first, scores(2))


def test_both_orders_trained_and_scored(tiny_bert_dir):
    doubled = both_orders(PAIRS)
    assert len(doubled) == 2 * len(PAIRS)
    assert {(p.text_b, p.text_a, p.label) for p in PAIRS} <= {(p.text_a, p.text_b, p.label) for p in doubled}

    model = train_crossencoder(PAIRS, _config(tiny_bert_dir, symmetric=True), device="cpu")
    symmetric = CrossEncoderReranker(model, symmetric=True)
    np.testing.assert_allclose(
        symmetric.score_pairs(TEXTS), symmetric.score_pairs([(b, a) for a, b in TEXTS]), atol=1e-6
    )


def test_truncation_cuts_the_query_and_keeps_the_faq_whole(tiny_bert_dir):
    model = load_crossencoder(tiny_bert_dir, device="cpu", max_length=24)
    tokenizer = model.tokenizer
    query = "I have had a sore throat and a mild fever for three days and now my ears hurt as well " * 3
    faq = "What are the symptoms of strep throat?"
    [(cut, kept)] = truncate_first(tokenizer, [(query, faq)], 24)
    assert kept == faq and query.startswith(cut) and len(cut) < len(query)
    assert len(tokenizer(cut, faq)["input_ids"]) <= 24
    assert truncate_first(tokenizer, [("short?", faq)], 24) == [("short?", faq)]
    # the FAQ's tokens survive tokenisation at the model's max length
    features = model.preprocess([(cut, kept)])
    decoded = tokenizer.decode(features["input_ids"][0], skip_special_tokens=True)
    assert decoded.endswith(faq.lower())


def test_batches_are_label_balanced_and_length_sorted():
    import random

    examples = [(i, 1) for i in range(20)] + [(i, 0) for i in range(20, 80)]
    batches = make_batches(examples, 8, random.Random(0), label=lambda e: e[1])
    assert sorted(e for batch in batches for e in batch) == sorted(examples)
    assert all(1 <= sum(label for _, label in batch) <= 3 for batch in batches[:-1])
    by_length = make_batches(examples, 8, random.Random(0), label=lambda e: e[1], length=lambda e: e[0] % 40)
    spreads = [max(e[0] % 40 for e in b) - min(e[0] % 40 for e in b) for b in by_length]
    assert sorted(e for batch in by_length for e in batch) == sorted(examples)
    assert np.mean(spreads) < np.mean([max(e[0] % 40 for e in b) - min(e[0] % 40 for e in b) for b in batches])


def test_best_epoch_weights_are_restored():
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    seen: list[torch.Tensor] = []
    dev = iter([0.5, 0.9, 0.7])

    def dev_score() -> float:
        seen.append(model.weight.detach().clone())
        return next(dev)

    config = EncoderTrainConfig(epochs=3, batch_size=2, lr=0.1)
    examples = [torch.randn(2) for _ in range(4)]
    history = train_loop(
        model, lambda batch: model(torch.stack(batch)).pow(2).mean(), examples, config, dev_score=dev_score
    )
    assert history["best_epoch"] == 2 and history["dev_score"] == [0.5, 0.9, 0.7]
    assert torch.equal(model.weight, seen[1]) and not torch.equal(seen[1], seen[2])


def test_each_training_step_hands_freed_memory_back(monkeypatch):
    import medfaq.common.runtime as runtime

    trims: list[int] = []
    monkeypatch.setattr(runtime, "_glibc_malloc_trim", lambda: trims.append)
    model = torch.nn.Linear(2, 1)
    config = EncoderTrainConfig(epochs=2, batch_size=2, lr=0.1)
    train_loop(model, lambda batch: model(torch.stack(batch)).pow(2).mean(), [torch.randn(2) for _ in range(6)], config)
    assert trims == [0] * 6  # 3 steps an epoch, 2 epochs


def test_the_schedule_counts_the_batches_distinct_texts_add():
    model = torch.nn.Linear(2, 1)
    config = EncoderTrainConfig(epochs=1, batch_size=3, lr=0.1)
    examples = [(f"q{i}", "the same FAQ", torch.randn(2)) for i in range(6)]  # no two may share a batch
    sizes: list[int] = []

    def loss(batch):
        sizes.append(len(batch))
        return model(torch.stack([example[2] for example in batch])).pow(2).mean()

    history = train_loop(model, loss, examples, config, distinct=lambda example: [example[1]])
    assert history["steps"] == 6 and sizes == [1] * 6  # six batches of one, where 6 / 3 = 2 were counted


def test_reranker_protocol_and_quantized_scores(tmp_path, tiny_bert_dir):
    config = _config(tiny_bert_dir, epochs=1, batch_size=4, lr=None)
    save_trained(train_crossencoder(PAIRS, config, device="cpu"), config, tmp_path / "ce")
    reranker = CrossEncoderReranker.load(tmp_path / "ce", device="cpu")
    quantized = CrossEncoderReranker.load(tmp_path / "ce", quantize=True)

    assert isinstance(reranker, Reranker)
    scores = reranker.score("Is shingles contagious?", ["Can I catch shingles?", "What is asthma?"])
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores)
    assert reranker.score("Is shingles contagious?", []) == []
    q_scores = quantized.score("Is shingles contagious?", ["Can I catch shingles?", "What is asthma?"])
    np.testing.assert_allclose(scores, q_scores, atol=0.05)
    short = CrossEncoderReranker.load(tmp_path / "ce", device="cpu", max_length=12)  # --rerank-max-length
    assert short.model.max_seq_length == 12 and reranker.model.max_seq_length == config.max_length
    question, faq = "my doctor said " * 20 + "is shingles contagious?", ["Can I catch shingles?"]
    assert short.score(question, faq) != reranker.score(question, faq)  # the question is cut to fit


def test_cosine_head_finds_the_second_text_after_the_separator_without_token_type_ids():
    tokens = torch.randn(1, 8, 4)
    ids = torch.tensor([[101, 5, 6, 102, 7, 8, 102, 0]])  # [CLS] a a [SEP] b b [SEP] [PAD]
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]])
    derived = SegmentCosine(separator_id=102)({"token_embeddings": tokens, "attention_mask": mask, "input_ids": ids})
    types = torch.tensor([[0, 0, 0, 0, 1, 1, 0, 0]])  # text 2 = its own tokens, separators on the side of text 1
    given = SegmentCosine()({"token_embeddings": tokens, "attention_mask": mask, "token_type_ids": types})
    assert torch.allclose(derived["scores"], given["scores"])
    with pytest.raises(MedfaqError, match="separator"):
        SegmentCosine()({"token_embeddings": tokens, "attention_mask": mask, "input_ids": ids})


LISTWISE = [
    Pair("Can I drink alcohol on amoxicillin?", "Is alcohol safe with antibiotics?", 1, "q1"),
    Pair("Can I drink alcohol on amoxicillin?", "What causes migraine headaches?", 0, "q1"),
    Pair("Can I drink alcohol on amoxicillin?", "How is type 2 diabetes treated?", 0, "q1"),
    Pair("Is shingles contagious?", "Can I catch shingles from someone?", 1, "q2"),
    Pair("Is shingles contagious?", "How is type 2 diabetes treated?", 0, "q2"),
    Pair("Is covid over?", "What causes migraine headaches?", 0, "q3"),  # out of scope: no positive
]


def test_ranking_groups_put_the_positive_first_and_drop_groups_without_one():
    groups = ranking_groups(LISTWISE)
    assert [[pair.label for pair in group] for group in groups] == [[1, 0, 0], [1, 0]]
    assert {pair.group for group in groups for pair in group} == {"q1", "q2"}


def test_mean_reciprocal_rank_of_each_groups_first_item():
    scores = np.array([0.9, 0.1, 0.5, 0.2, 0.8, 0.3, 0.6, 0.7])  # positives ranked first, second and third
    assert mean_reciprocal_rank(scores, [2, 3, 3]) == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)


def test_listwise_training_is_seeded_ranks_positives_first_and_keeps_the_best_dev_epoch(tiny_bert_dir):
    def train(seed: int):
        config = make_config(
            "crossencoder",
            "faq",
            "quick",
            init=str(tiny_bert_dir),
            loss="listwise",
            epochs=3,
            batch_size=2,
            lr=5e-3,
            seed=seed,
            precision="fp32",
        )
        model = train_crossencoder(LISTWISE, config, device="cpu", dev=LISTWISE)
        return config, CrossEncoderReranker(model).score_pairs([(p.text_a, p.text_b) for p in LISTWISE])

    config, first = train(1)
    history = config.extra["history"]
    assert len(history["dev_score"]) == 3 and history["best_epoch"] == 1 + int(np.argmax(history["dev_score"]))
    np.testing.assert_array_equal(first, train(1)[1])
    assert not np.allclose(first, train(2)[1])
    assert first[0] > max(first[1], first[2]) and first[3] > first[4]


def test_listwise_loss_needs_the_faq_task_and_fits_cross_encoders_only():
    with pytest.raises(MedfaqError, match="needs --task faq"):
        make_config("crossencoder", "mqp", "quick", loss="listwise")
    with pytest.raises(MedfaqError, match="does not fit a biencoder"):
        make_config("biencoder", "faq", "quick", loss="listwise")


def test_a_reranker_with_a_prior_scores_its_cosine_plus_a_learned_correction_and_saves_the_prior(
    tmp_path, tiny_bert_dir
):
    from medfaq.retriever.biencoder.scorer import BiEncoderScorer, load_biencoder

    settings = {"init": str(tiny_bert_dir), "loss": "listwise", "batch_size": 2, "precision": "fp32", "epochs": 3}
    config = make_config(
        "crossencoder", "faq", "quick", lr=5e-3, negatives_encoder=str(tiny_bert_dir), prior_scale=20.0, **settings
    )
    model = train_crossencoder(LISTWISE, config, device="cpu")
    save_trained(model, config, tmp_path / "reranker")
    reloaded = CrossEncoderReranker.load(tmp_path / "reranker", device="cpu")
    assert reloaded.prior is not None and (tmp_path / "reranker" / "prior" / "config.json").is_file()
    assert reloaded.corrects_first_stage  # so the pipeline's auto fusion orders by its scores alone
    assert not CrossEncoderReranker(model).corrects_first_stage

    texts = [(p.text_a, p.text_b) for p in LISTWISE]
    cosines = BiEncoderScorer(load_biencoder(str(tiny_bert_dir), "cpu")).score_pairs(texts)
    logits = model.predict(texts, activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(reloaded.score_pairs(texts), cosines + logits / 20.0, atol=1e-5)


def test_a_duplicate_detector_with_a_prior_learns_a_centred_correction_and_scores_both_orders_alike(
    tmp_path, tiny_bert_dir
):
    from medfaq.retriever.biencoder.scorer import BiEncoderScorer, load_biencoder
    from medfaq.retriever.reranker.training import training_prior
    from medfaq.retriever.training.pair_models import as_scorer, saved_threshold

    assert make_config("crossencoder", "mqp", "quick").prior_model == "mpnet"  # the quick preset corrects MPNet
    config = _config(tiny_bert_dir, prior_scale=10.0, prior_encoder=str(tiny_bert_dir), precision="fp32")
    assert config.prior_model == str(tiny_bert_dir) and config.symmetric
    model = train_crossencoder(PAIRS, config, device="cpu")
    scorer = as_scorer(model, config)
    save_trained(model, config, tmp_path / "ce")
    reloaded = CrossEncoderReranker.load(tmp_path / "ce", device="cpu")
    assert (tmp_path / "ce" / "prior" / "config.json").is_file()

    cosines = BiEncoderScorer(load_biencoder(str(tiny_bert_dir), "cpu")).score_pairs(TEXTS)
    swapped = [(b, a) for a, b in TEXTS]
    logits = (
        model.predict(TEXTS, activation_fn=torch.nn.Identity())
        + model.predict(swapped, activation_fn=torch.nn.Identity())
    ) / 2
    expected = cosines + logits / 10.0
    np.testing.assert_allclose(scorer.score_pairs(TEXTS), expected, atol=1e-5)
    np.testing.assert_allclose(reloaded.score_pairs(TEXTS), expected, atol=1e-5)
    np.testing.assert_allclose(reloaded.score_pairs(swapped), expected, atol=1e-5)

    both = cosines.tolist() * 2  # both orders of every pair
    assert saved_threshold(tmp_path / "ce") == pytest.approx(config.extra["prior_median"]) == np.median(both)
    assert scorer.decision_boundary == reloaded.decision_boundary == config.extra["prior_median"]
    _, offsets = training_prior(config, model, PAIRS)  # the prior's median pair starts at logit 0
    assert np.median(list(offsets.values())) == pytest.approx(0.0, abs=1e-6)
    np.testing.assert_allclose([offsets[text] for text in TEXTS], 10.0 * (cosines - np.median(cosines)), atol=1e-5)


def test_only_a_cross_encoder_takes_a_prior():
    with pytest.raises(MedfaqError, match="prior-scale"):
        make_config("biencoder", "mqp", "quick", prior_scale=20.0)
    with pytest.raises(MedfaqError, match="prior-scale"):
        make_config("crossencoder", "mqp", "quick", prior_scale=-1.0)


def test_reranker_precision_bf16_scores_close_to_fp32_and_is_validated(tmp_path, tiny_bert_dir):
    from medfaq.retriever.pipeline import PipelineConfig

    config = _config(tiny_bert_dir, precision="fp32")
    save_trained(train_crossencoder(PAIRS, config, device="cpu"), config, tmp_path / "ce")
    fp32 = CrossEncoderReranker.load(tmp_path / "ce", device="cpu").score_pairs(TEXTS)
    bf16 = CrossEncoderReranker.load(tmp_path / "ce", device="cpu", precision="bf16").score_pairs(TEXTS)
    assert not np.array_equal(fp32, bf16)  # the products did run in bf16
    np.testing.assert_allclose(fp32, bf16, atol=0.05)
    assert PipelineConfig(rerank_precision="auto").rerank_precision == "auto"
    with pytest.raises(MedfaqError, match="unknown rerank precision"):
        PipelineConfig(rerank_precision="int4")


def test_a_remembering_bi_encoder_encodes_each_text_once_and_scores_as_before(tiny_bert_dir):
    from medfaq.retriever.biencoder.scorer import BiEncoderScorer, load_biencoder

    model = load_biencoder(str(tiny_bert_dir), "cpu")
    plain, remembering = BiEncoderScorer(model), BiEncoderScorer(model, remember=True)
    encoded: list[str] = []
    original = remembering.encode

    def counting(texts, progress=False):
        encoded.extend(texts)
        return original(texts, progress)

    remembering.encode = counting
    for _ in range(2):
        np.testing.assert_allclose(remembering.score_pairs(TEXTS), plain.score_pairs(TEXTS), atol=1e-6)
    assert sorted(encoded) == sorted({text for pair in TEXTS for text in pair})
