"""Duplicate detection: leak-free MQP splits, dev-only thresholds, metrics, bi-encoder round trips, the CLI."""

from __future__ import annotations

import json
import zlib
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from experiments.keep_ratio_sweep import keep_ratio_sweep
from medfaq.app.cli import app
from medfaq.common.runtime import MedfaqError
from medfaq.eval.duplicate_detection import DuplicateEvaluator, binary_metrics, fold_metrics, make_folds, tune_threshold
from medfaq.index.pair_sources import load_mqp
from medfaq.retriever.biencoder.scorer import BiEncoderScorer, load_biencoder
from medfaq.retriever.biencoder.training import train_biencoder
from medfaq.retriever.training.config import EncoderTrainConfig, make_config
from medfaq.retriever.training.pair_data import Pair, mnrl_triplets, mqp_pairs, mqp_sibling_negatives, read_pairs_file
from medfaq.retriever.training.pair_models import (
    as_scorer,
    load_pair_scorer,
    save_trained,
    train_pair_model,
    training_pairs,
)

runner = CliRunner()


def synthetic_pairs(doctors: int = 5, groups_per_doctor: int = 6) -> list[Pair]:
    """MQP-shaped pairs: every group (question_1) has one similar and one different question, one doctor each."""
    pairs = []
    for d in range(doctors):
        for g in range(groups_per_doctor):
            question = f"question {d}-{g} about condition {g}"
            pairs.append(Pair(question, f"similar to {d}-{g}", 1, f"g{d}-{g}", f"dr{d}"))
            pairs.append(Pair(question, f"different from {d}-{g}", 0, f"g{d}-{g}", f"dr{d}"))
    return pairs


class RuleScorer:
    """A deterministic stand-in model: high scores for the "similar" questions."""

    def score_pairs(self, pairs, progress=False):
        return np.array([float(b.startswith("similar")) + 0.001 * len(a) for a, b in pairs])


def assert_no_leak(pairs, folds, key):
    tested = Counter()
    for fold in folds:
        parts = [{key(pairs[i]) for i in part} for part in (fold.train, fold.dev, fold.test)]
        assert not (parts[0] & parts[1]) and not (parts[0] & parts[2]) and not (parts[1] & parts[2])
        assert sorted(fold.train + fold.dev + fold.test) == list(range(len(pairs)))
        tested.update(fold.test)
    assert all(tested[i] == 1 for i in range(len(pairs)))  # every pair is tested exactly once


@pytest.mark.parametrize("split", ["doctor", "grouped"])
def test_real_mqp_folds_never_leak_a_doctor_or_a_question(shared_data, split):
    pairs = mqp_pairs(shared_data)
    assert len(pairs) == 3048 and len({p.author for p in pairs}) == 11
    folds = make_folds(pairs, split, k=3, seed=0, min_dev_groups=2)
    assert_no_leak(pairs, folds, lambda p: p.author if split == "doctor" else p.group)
    for fold in folds:  # the question_1 groups never straddle parts either (each group has one doctor)
        assert not ({pairs[i].group for i in fold.train} & {pairs[i].group for i in fold.test})
        assert len({pairs[i].author for i in fold.dev}) >= 2  # --dev-groups 2: never one doctor alone


def test_dev_parts_hold_the_fewest_groups_asked_and_leave_one_to_train():
    pairs = synthetic_pairs()  # 5 doctors: 3 folds leave 3 or 4 doctors per pool
    for min_dev_groups, expected in ((1, {1}), (2, {2}), (9, {2, 3})):
        folds = make_folds(pairs, "doctor", 3, seed=0, min_dev_groups=min_dev_groups)
        assert {len({pairs[i].author for i in fold.dev}) for fold in folds} == expected
        assert all(fold.train for fold in folds)
        assert_no_leak(pairs, folds, lambda p: p.author)


def test_folds_are_deterministic_and_reject_bad_fold_counts():
    pairs = synthetic_pairs()
    assert make_folds(pairs, "grouped", 3, seed=1) == make_folds(pairs, "grouped", 3, seed=1)
    assert_no_leak(pairs, make_folds(pairs, "doctor", 5, seed=0), lambda p: p.author)
    with pytest.raises(Exception, match="between 2 and"):
        make_folds(pairs, "doctor", 6)
    with pytest.raises(Exception, match="unknown split"):
        make_folds(pairs, "random", 3)


def test_tune_threshold_and_metrics():
    scores, labels = np.array([0.1, 0.4, 0.6, 0.9]), np.array([0, 0, 1, 1])
    assert tune_threshold(scores, labels, "accuracy") == pytest.approx(0.5)
    assert tune_threshold(scores, labels, "f1") == pytest.approx(0.5)
    assert binary_metrics(scores, labels, 0.5) == {
        "accuracy": 1.0,
        "precision": 1.0,
        "recall": 1.0,
        "f1": 1.0,
        "auc": 1.0,
    }
    assert tune_threshold(np.array([0.9, 0.8, 0.1]), np.array([0, 0, 1]), "accuracy") > 0.9  # predict none positive
    half = binary_metrics(scores, np.array([0, 1, 0, 1]), 0.5)
    assert half["accuracy"] == 0.5 and half["auc"] == 0.75


def test_thresholds_come_from_dev_only():
    rng = np.random.default_rng(0)
    dev_scores, dev_labels = rng.random(40), rng.integers(0, 2, 40)
    test_scores, test_labels = rng.random(30), rng.integers(0, 2, 30)
    original = fold_metrics(dev_scores, dev_labels, test_scores, test_labels)
    flipped = fold_metrics(dev_scores, dev_labels, test_scores, 1 - test_labels)
    assert original["threshold_f1"] == flipped["threshold_f1"]
    assert original["threshold_accuracy"] == flipped["threshold_accuracy"]
    assert original["accuracy"] != flipped["accuracy"]


def test_evaluator_thresholds_ignore_test_labels():
    pairs = synthetic_pairs()
    result = DuplicateEvaluator(pairs, "doctor", folds=3, print_fn=lambda _: None)(lambda train, dev, k: RuleScorer())
    assert result["accuracy"] == 1.0 and result["accuracy_std"] == 0.0 and result["folds"] == 3
    folds = make_folds(pairs, "doctor", 3)
    for k, fold in enumerate(folds):  # flip the labels of fold k's test pairs: fold k's thresholds stay
        flipped = [
            Pair(p.text_a, p.text_b, 1 - p.label, p.group, p.author) if i in fold.test else p
            for i, p in enumerate(pairs)
        ]
        evaluator = DuplicateEvaluator(flipped, "doctor", folds=3, print_fn=lambda _: None)
        after = evaluator(lambda train, dev, k: RuleScorer())["per_fold"][k]
        assert after["threshold_f1"] == result["per_fold"][k]["threshold_f1"]
        assert after["threshold_accuracy"] == result["per_fold"][k]["threshold_accuracy"]
        assert after["accuracy"] == 0.0


class BoundaryScorer:
    """NoisyScorer's scores with a decision boundary of its own, as a cross-encoder has."""

    decision_boundary = 1.2

    def score_pairs(self, pairs, progress=False):
        return NoisyScorer().score_pairs(pairs)


def test_threshold_rules_use_the_models_own_boundary_or_dev():
    pairs, quiet = synthetic_pairs(), {"print_fn": lambda _: None}
    for rule, scorer, expected in (
        ("auto", BoundaryScorer(), "boundary"),
        ("boundary", BoundaryScorer(), "boundary"),
        ("dev", BoundaryScorer(), "dev"),
        ("auto", NoisyScorer(), "dev"),  # a bi-encoder's cosine: no boundary of its own
    ):
        result = DuplicateEvaluator(pairs, "doctor", 3, threshold_rule=rule, **quiet)(lambda t, d, k: scorer)
        assert result["threshold_rule"] == expected
        for fold, part in zip(result["per_fold"], make_folds(pairs, "doctor", 3), strict=True):
            test = [pairs[i] for i in part.test]
            scores, labels = scorer.score_pairs([(p.text_a, p.text_b) for p in test]), [p.label for p in test]
            threshold = 1.2 if expected == "boundary" else fold["threshold_accuracy"]
            assert fold["accuracy"] == binary_metrics(scores, labels, threshold)["accuracy"]
            assert (fold["threshold_f1"] == fold["threshold_accuracy"] == 1.2) == (expected == "boundary")
    with pytest.raises(MedfaqError, match="no decision boundary"):
        DuplicateEvaluator(pairs, "doctor", 3, threshold_rule="boundary", **quiet)(lambda t, d, k: NoisyScorer())
    with pytest.raises(MedfaqError, match="unknown threshold rule 'best'"):
        DuplicateEvaluator(pairs, "doctor", 3, threshold_rule="best", **quiet)


class NoisyScorer:
    """The rule of RuleScorer blurred by a checksum of the second text, so some pairs are scored wrongly."""

    def score_pairs(self, pairs, progress=False):
        return np.array([float(b.startswith("similar")) + zlib.crc32(b.encode()) % 100 / 60 for a, b in pairs])


def test_evaluator_writes_every_dev_and_test_score(tmp_path):
    pairs = synthetic_pairs()
    path = tmp_path / "scores.jsonl"
    result = DuplicateEvaluator(pairs, "doctor", folds=3, print_fn=lambda _: None, scores_path=path)(
        lambda train, dev, k: NoisyScorer()
    )
    assert result["accuracy"] < 1
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for k, fold in enumerate(make_folds(pairs, "doctor", 3)):
        for part, indices in (("dev", fold.dev), ("test", fold.test)):
            written = [r for r in records if r["fold"] == k + 1 and r["part"] == part]
            assert [(r["text_a"], r["text_b"], r["label"]) for r in written] == [
                (pairs[i].text_a, pairs[i].text_b, pairs[i].label) for i in indices
            ]
            scores = np.array([r["score"] for r in written])
            np.testing.assert_allclose(scores, NoisyScorer().score_pairs([(r["text_a"], r["text_b"]) for r in written]))
        test = [r for r in records if r["fold"] == k + 1 and r["part"] == "test"]
        threshold = result["per_fold"][k]["threshold_accuracy"]
        accuracy = np.mean([(r["score"] >= threshold) == r["label"] for r in test])
        assert accuracy == pytest.approx(result["per_fold"][k]["accuracy"])


@pytest.mark.parametrize("loss", ["contrastive", "mnrl"])
def test_biencoder_train_save_reload_gives_same_scores(tmp_path, tiny_encoder_dir, loss):
    pairs = synthetic_pairs(doctors=1, groups_per_doctor=4)
    config = make_config("biencoder", "mqp", "quick", init=str(tiny_encoder_dir), loss=loss, epochs=1, batch_size=4)
    model = train_biencoder(pairs, replace(config, max_length=8), device="cpu")
    assert model.max_seq_length == load_biencoder(str(tiny_encoder_dir)).max_seq_length > 8  # trained on 8 tokens
    texts = [(p.text_a, p.text_b) for p in pairs]
    before = BiEncoderScorer(model).score_pairs(texts)
    save_trained(model, config, tmp_path / "be")
    after = load_pair_scorer(tmp_path / "be", device="cpu").score_pairs(texts)
    np.testing.assert_allclose(before, after, rtol=1e-5, atol=1e-6)
    assert isinstance(load_pair_scorer(tmp_path / "be"), BiEncoderScorer)
    assert EncoderTrainConfig.load(tmp_path / "be").loss == loss


def test_biencoder_keep_ratio_interpolates_between_start_and_fine_tuned_weights(tiny_encoder_dir):
    pairs = synthetic_pairs(doctors=1, groups_per_doctor=4)
    start = load_biencoder(str(tiny_encoder_dir), "cpu").state_dict()
    models = {
        ratio: train_biencoder(
            pairs, make_config("biencoder", "mqp", "quick", init=str(tiny_encoder_dir), keep_ratio=ratio), "cpu"
        ).state_dict()
        for ratio in (1.0, 0.5)
    }
    changed = [
        name for name, value in start.items() if value.is_floating_point() and not value.equal(models[1.0][name])
    ]
    assert changed
    for name in changed:
        torch.testing.assert_close(models[0.5][name], (start[name] + models[1.0][name]) / 2)
    for model_type in ("biencoder", "crossencoder"):
        with pytest.raises(MedfaqError, match="keep ratio"):
            make_config(model_type, "mqp", "quick", keep_ratio=0.0)


def test_keep_ratio_sweep_matches_cross_validation_trained_at_each_ratio(tiny_bert_dir):
    pairs = synthetic_pairs()
    quiet = {"print_fn": lambda _: None}
    tiny_prior = {"prior_encoder": str(tiny_bert_dir)}
    sweep = keep_ratio_sweep(
        pairs, init=str(tiny_bert_dir), ratios=(1.0, 0.5), folds=2, device="cpu", overrides=tiny_prior, **quiet
    )
    for ratio in (1.0, 0.5):
        config = make_config("crossencoder", "mqp", "quick", init=str(tiny_bert_dir), keep_ratio=ratio, **tiny_prior)

        def fit(train, dev, fold):
            return as_scorer(train_pair_model(train, replace(config), "cpu", dev), config)

        direct = DuplicateEvaluator(pairs, "doctor", 2, 0, **quiet)(fit)
        for metric in ("accuracy", "auc"):
            assert sweep["ratios"][f"{ratio:g}"][metric] == pytest.approx(direct[metric], abs=1e-6)
    assert sweep["ratios"]["1"]["auc"] != sweep["ratios"]["0.5"]["auc"]


def test_mnrl_triplets_prefer_labelled_negatives_and_mine_the_rest():
    pairs = [Pair("a", "a similar", 1), Pair("a", "a different", 0), Pair("b", "b similar", 1)]

    def encode(texts):  # "b similar" is closest to "b" apart from itself: "a similar" shares the word
        vectors = np.array([[t.startswith("a"), t.startswith("b"), "similar" in t] for t in texts], dtype=float)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    triplets = mnrl_triplets(pairs, encode)
    assert triplets[0] == ("a", "a similar", "a different")
    assert triplets[1][:2] == ("b", "b similar") and triplets[1][2] != "b similar"


def test_read_pairs_file_aliases_and_errors(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [
        {"question_1": "q1", "question_2": "q2", "label": 1, "dr_id": "3"},
        {"text_a": "x", "text_b": "y", "label": 0},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = read_pairs_file(path)
    assert [(p.text_a, p.text_b, p.label, p.author) for p in pairs] == [("q1", "q2", 1, "3"), ("x", "y", 0, "")]
    path.write_text(json.dumps({"text_a": "x", "label": 1}) + "\n")
    with pytest.raises(Exception, match="pairs.jsonl:1"):
        read_pairs_file(path)


def test_load_mqp_groups_consecutive_rows(shared_data):
    rows = load_mqp(shared_data)
    assert rows[0]["group_id"] == rows[1]["group_id"] != rows[2]["group_id"]
    assert Counter(row["group_id"] for row in rows).most_common(1)[0][1] == 2


def test_sibling_negatives_pair_the_two_rewrites_of_each_question(shared_data):
    pairs = [
        Pair("q", "similar", 1, "g1", "7", "mqp"),
        Pair("q", "dissimilar", 0, "g1", "7", "mqp"),
        Pair("r", "only a positive", 1, "g2", "8", "mqp"),
    ]
    assert mqp_sibling_negatives(pairs) == [Pair("similar", "dissimilar", 0, "g1", "7", "mqp-sibling")]
    real = mqp_pairs(shared_data)
    siblings = mqp_sibling_negatives(real)
    assert len(siblings) == len(real) // 2 and {p.label for p in siblings} == {0}
    rewrites = {(p.group, p.text_b) for p in real}
    assert all((p.group, p.text_a) in rewrites and (p.group, p.text_b) in rewrites for p in siblings)
    config = make_config("crossencoder", "mqp", "quick", sibling_negatives=True)
    assert training_pairs(real[:4], config) == [*real[:4], *mqp_sibling_negatives(real[:4])]
    assert training_pairs(real[:4], replace(config, sibling_negatives=False)) == real[:4]
    with pytest.raises(MedfaqError, match="needs --task mqp"):
        make_config("crossencoder", "faq", "quick", sibling_negatives=True)


def medfaq(*args):
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(result, pattern):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and pattern in lines[0], result.stderr


def test_cli_errors_are_one_line(tmp_path):
    assert_one_line_error(medfaq("eval", "duplicates"), "--model-type")
    assert_one_line_error(medfaq("eval", "duplicates", "--model-type", "rnn"), "unknown model type")
    bad_rule = ("eval", "duplicates", "--model-type", "crossencoder", "--threshold-rule", "best")
    assert_one_line_error(medfaq(*bad_rule), "unknown threshold rule")
    bi_boundary = ("eval", "duplicates", "--model-type", "biencoder", "--threshold-rule", "boundary")
    assert_one_line_error(medfaq(*bi_boundary), "no decision boundary")
    assert_one_line_error(medfaq("eval", "duplicates", "--model", tmp_path), "--pairs")
    missing = tmp_path / "none.jsonl"
    assert_one_line_error(medfaq("eval", "duplicates", "--model", "minilm", "--pairs", missing), "not found")
    assert_one_line_error(medfaq("train", "crossencoder", "--task", "qq", "--out", tmp_path / "m"), "unknown task")
    assert_one_line_error(medfaq("train", "biencoder", "--loss", "bce", "--out", tmp_path / "m"), "does not fit")
    assert_one_line_error(medfaq("train", "crossencoder", "--head", "rnn", "--out", tmp_path / "m"), "unknown head")
    no_prior = ("--prior-scale", "0")  # without the MPNet prior of the quick preset, the data is checked next
    assert_one_line_error(medfaq("train", "crossencoder", *no_prior, "--out", tmp_path / "m"), "medfaq data fetch mqp")
    assert_one_line_error(
        medfaq("eval", "duplicates", "--model-type", "crossencoder", "--init", tmp_path / "nope"), "not a local"
    )


def test_cli_cross_validation_saved_folds_and_pairs_scoring(tmp_path, shared_data, tiny_bert_dir):
    assert medfaq("data", "fetch", "mqp", "--from", shared_data).exit_code == 0
    saved = tmp_path / "folds"
    args = ["--model-type", "crossencoder", "--init", tiny_bert_dir, "--prior-encoder", tiny_bert_dir]
    args += ["--split", "doctor", "--folds", "2"]
    result = medfaq("eval", "duplicates", *args, "--max-pairs", "64", "--epochs", "1", "--json", "--save-models", saved)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    for metric in ("accuracy", "f1", "precision", "recall", "auc"):
        assert 0.0 <= summary[metric] <= 1.0 and summary[f"{metric}_std"] >= 0.0
    assert summary["folds"] == 2 and summary["split"] == "doctor"
    assert all(len(fold["dev_score"]) == 1 and fold["best_epoch"] == 1 for fold in summary["per_fold"])

    fold = saved / "fold-1"
    scored = medfaq("eval", "duplicates", "--model", fold, "--pairs", fold / "test.jsonl", "--json")
    assert scored.exit_code == 0, scored.output
    repeat = json.loads(scored.stdout)
    assert repeat["threshold"] == summary["per_fold"][0]["threshold_accuracy"]
    assert repeat["accuracy"] == pytest.approx(summary["per_fold"][0]["accuracy"])
    assert repeat["auc"] == pytest.approx(summary["per_fold"][0]["auc"])


@pytest.mark.parametrize("command", [("train", "biencoder", "--out", "m"), ("eval", "duplicates", "--model-type", "x")])
def test_training_overrides_reach_the_config(monkeypatch, command):
    from medfaq.app.options import TRAINING_OVERRIDES
    from medfaq.common.runtime import MedfaqError
    from medfaq.retriever.training import config as training_config

    seen = {}

    def make_config(model_type, task, preset, **overrides):
        seen.update(overrides)
        raise MedfaqError("stop")

    monkeypatch.setattr(training_config, "make_config", make_config)
    given = ("--epochs", "2", "--lr", "0.5", "--keep-ratio", "0.5", "--prior-scale", "3", "--no-sibling-negatives")
    assert_one_line_error(medfaq(*command, *given), "stop")
    assert set(TRAINING_OVERRIDES) <= set(seen)
    assert {k: seen[k] for k in ("epochs", "lr", "keep_ratio", "prior_scale", "sibling_negatives", "loss")} == {
        "epochs": 2,
        "lr": 0.5,
        "keep_ratio": 0.5,
        "prior_scale": 3.0,
        "sibling_negatives": False,
        "loss": None,
    }
