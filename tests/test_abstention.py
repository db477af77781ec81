"""`--encoder auto` and the abstention threshold that travels with a model: calibrated on the development split,
inherited by a new index (marked so in its pipeline.json), overridden by `--save-threshold`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfaq.app.cli import app
from medfaq.common.runtime import DEFAULT_ENCODER, models_dir
from medfaq.retriever import threshold_files
from medfaq.retriever.decisions.abstention import at_threshold, calibrate_model, inherit_thresholds
from medfaq.retriever.pipeline_file import PIPELINE_FILE, read_config, store_threshold
from medfaq.retriever.threshold_files import (
    THRESHOLD_FILE,
    ModelThreshold,
    model_thresholds,
    save_stock_threshold,
    stock_threshold,
)
from medfaq.retriever.trained_models import BIENCODER_MODEL, MPNET_BIENCODER_MODEL, choose_encoder

QUESTIONS = [
    ("i drink beer every night and take amoxicillin, is that bad?", "Can I drink alcohol while taking amoxicillin?"),
    ("my grandmother has shingles, how do doctors treat it?", "How is shingles treated?"),
    ("is my son going to get parkinson's like his grandfather?", "Is Parkinson's disease inherited?"),
    ("why do i keep getting these awful migraines", "What causes migraine headaches?"),
]
BANK = ["What are the symptoms of type 2 diabetes?", "How do vaccines protect against measles?", "What is asthma?"]


@pytest.fixture
def dev_data(tmp_path) -> Path:
    """A data root in the shared/data layout holding MeQSum train and valid splits."""
    root = tmp_path / "data"
    (root / "meqsum").mkdir(parents=True)
    rows = {"train": [("a question", faq) for faq in BANK], "valid": QUESTIONS}
    for split, pairs in rows.items():
        lines = [json.dumps({"id": f"{split}-{i}", "chq": chq, "faq": faq}) for i, (chq, faq) in enumerate(pairs)]
        (root / "meqsum" / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def _set_up_biencoder(tiny_encoder_dir: Path) -> Path:
    """The tiny encoder saved where `medfaq setup` saves the fine-tuned bi-encoder."""
    target = models_dir() / BIENCODER_MODEL
    shutil.copytree(tiny_encoder_dir, target)
    return target


def test_auto_is_the_ruled_stock_encoder_until_setup_saved_a_fine_tuned_one_then_the_best_of_them(tiny_encoder_dir):
    assert choose_encoder("auto") == "mpnet"  # the encoder rule over the stock encoders' shipped measurements
    (models_dir() / BIENCODER_MODEL).mkdir(parents=True)  # a training still running: no config.json yet
    assert choose_encoder("auto") == "mpnet"
    shutil.rmtree(models_dir() / BIENCODER_MODEL)
    tuned = _set_up_biencoder(tiny_encoder_dir)
    assert choose_encoder("auto") == str(tuned)
    mpnet = shutil.copytree(tiny_encoder_dir, models_dir() / MPNET_BIENCODER_MODEL)  # the better one, once saved
    assert choose_encoder("auto") == str(mpnet)
    assert choose_encoder("minilm") == "minilm" and choose_encoder(str(tiny_encoder_dir)) == str(tiny_encoder_dir)


def test_setup_builds_its_stock_index_with_minilm_by_name():
    from medfaq.app.setup_state import DemoSettings, default_steps

    stock = default_steps(DemoSettings.from_env(fast=True))[0].commands[-1]
    assert stock[:3] == ("index", "build", "medquad") and stock[stock.index("--encoder") + 1] == DEFAULT_ENCODER


def test_calibrated_threshold_is_inherited_by_a_new_index_and_overridden(tmp_path, tiny_encoder_dir, dev_data):
    tuned = _set_up_biencoder(tiny_encoder_dir)
    stored = calibrate_model(tuned, dev_data)
    saved = json.loads((tuned / THRESHOLD_FILE).read_text(encoding="utf-8"))
    assert saved["key"] == "dense@raw" and saved["value"] == stored.value
    assert saved["counts"] == {"in_scope": 4, "out_of_scope": 4}
    meqsum = saved["calibrated_on"]["sources"]["meqsum"]
    assert meqsum["queries"] == 4 and meqsum["bank"] == 7
    assert 4 <= meqsum["removed"] <= 7  # the golds, and what a random tiny encoder puts within cosine 0.9 of them
    assert 0 <= saved["development"]["accuracy"] <= 100

    faqs = tmp_path / "faqs.jsonl"
    faqs.write_text("\n".join(json.dumps({"id": str(i), "question": q}) for i, q in enumerate(BANK)) + "\n")
    out = tmp_path / "idx"
    result = CliRunner().invoke(app, ["index", "build", str(faqs), "--out", str(out)])  # --encoder auto
    assert result.exit_code == 0, result.output
    assert f"encoder: {tuned} (auto: the fine-tuned bi-encoder" in result.output
    assert json.loads((out / "manifest.json").read_text())["encoder"] == str(tuned)
    config = read_config(out)
    assert config.abstain and config.active_threshold() == stored.value
    assert config.inherited_thresholds == {"dense@raw": str(tuned / THRESHOLD_FILE)}

    store_threshold(out, config, 0.5)  # what `medfaq eval retrieval --save-threshold` writes
    config = read_config(out)
    assert config.active_threshold() == 0.5 and config.inherited_thresholds == {}
    assert inherit_thresholds(out, str(tuned)) == {}  # a threshold calibrated on the index stays
    assert read_config(out).thresholds == {"dense@raw": 0.5}


def test_an_index_rebuilt_with_an_uncalibrated_encoder_drops_the_inherited_threshold(tmp_path, tiny_encoder_dir):
    calibrated = tmp_path / "calibrated"
    shutil.copytree(tiny_encoder_dir, calibrated)
    ModelThreshold(0.3, "dense@raw", "cosine", str(calibrated), "none", {}, {}).save(calibrated)
    index_dir = tmp_path / "idx"
    index_dir.mkdir()
    assert inherit_thresholds(index_dir, str(calibrated)) == {"dense@raw": 0.3}
    assert inherit_thresholds(index_dir, str(tiny_encoder_dir)) == {}
    assert read_config(index_dir).thresholds == {}
    assert (index_dir / PIPELINE_FILE).is_file()


def test_an_index_whose_pipeline_json_is_missing_or_partial_abstains_at_its_encoders_threshold(
    tmp_path, tiny_encoder_dir
):
    calibrated = tmp_path / "calibrated"
    shutil.copytree(tiny_encoder_dir, calibrated)
    ModelThreshold(2.0, "dense@raw", "cosine", str(calibrated), "none", {}, {}).save(calibrated)  # above any cosine
    out = tmp_path / "idx"
    build = ["index", "build", str(_faq_file(tmp_path)), "--out", str(out), "--encoder", str(calibrated)]
    assert CliRunner().invoke(app, build).exit_code == 0
    search = ["search", "--index", str(out), "--json", "best pizza in town"]
    for partial in (None, {"top_k": 3}, {"top_k": 3, "thresholds": {}}):
        (out / PIPELINE_FILE).unlink(missing_ok=True)
        if partial is not None:
            (out / PIPELINE_FILE).write_text(json.dumps(partial), encoding="utf-8")
        config = read_config(out)
        assert config.active_threshold() == 2.0
        assert config.inherited_thresholds == {"dense@raw": str(calibrated / THRESHOLD_FILE)}
        result = CliRunner().invoke(app, search)
        assert result.exit_code == 0 and json.loads(result.stdout)["abstained"], result.output


def test_reranker_threshold_is_calibrated_over_its_first_stage(tmp_path, tiny_encoder_dir, tiny_bert_dir, dev_data):
    from medfaq.retriever.reranker.training import train_crossencoder
    from medfaq.retriever.training.config import make_config
    from medfaq.retriever.training.pair_data import Pair
    from medfaq.retriever.training.pair_models import save_trained

    config = make_config(
        "crossencoder",
        "faq",
        "quick",
        init=str(tiny_bert_dir),
        loss="listwise",
        epochs=1,
        batch_size=2,
        negatives_encoder=str(tiny_encoder_dir),
        precision="fp32",
    )
    groups = [Pair(chq, faq, 1, chq) for chq, faq in QUESTIONS] + [Pair(chq, BANK[0], 0, chq) for chq, _ in QUESTIONS]
    reranker = save_trained(train_crossencoder(groups, config, device="cpu", dev=groups), config, tmp_path / "ce")
    stored = calibrate_model(reranker, dev_data)
    assert stored.key == "dense+rerank@raw" and stored.first_stage == str(Path(tiny_encoder_dir).resolve())
    assert model_thresholds(str(tiny_encoder_dir), reranker) == {
        "dense+rerank@raw": (stored.value, str(reranker / THRESHOLD_FILE))
    }
    assert model_thresholds(DEFAULT_ENCODER, reranker) == {}  # calibrated over another first stage


def test_at_threshold_counts_answers_and_abstentions():
    metrics = at_threshold([True, True, False, False], [0.9, 0.4, 0.3, None], 0.35)
    assert metrics == {"auroc": 100.0, "threshold": 0.35, "accuracy": 100.0, "answered": 100.0, "ood_abstained": 100.0}
    assert at_threshold([True, True, False, False], [0.9, 0.4, 0.3, None], 0.5)["answered"] == 50.0


def test_calibrate_without_development_data_is_one_line(tiny_encoder_dir):
    result = CliRunner().invoke(app, ["train", "calibrate", str(tiny_encoder_dir)])
    assert result.exit_code == 2 and result.stderr.startswith("error: calibrating a threshold needs")
    assert "medfaq data fetch meqsum healthcaremagic chq_summ" in result.stderr


def test_benchmark_index_inherits_and_is_measured_at_that_threshold(tmp_path, tiny_encoder_dir, shared_data):
    from experiments.inherited_threshold import measure

    calibrated = tmp_path / "calibrated"
    shutil.copytree(tiny_encoder_dir, calibrated)
    ModelThreshold(0.5, "dense@raw", "cosine", str(calibrated), "none", {}, {}).save(calibrated)
    out = tmp_path / "bench"
    args = ["data", "make-benchmark", "mediqa2021", "--out", str(out), "--from", str(shared_data)]
    result = CliRunner().invoke(app, [*args, "--encoder", str(calibrated), "--synonyms", "none"])
    assert result.exit_code == 0, result.output
    assert "abstains below 0.5000 (dense@raw), the threshold inherited from the model" in result.stderr

    report = measure(out)
    assert report["threshold"] == 0.5 and report["inherited_from"] == str(calibrated / THRESHOLD_FILE)
    assert report["in_scope"] == 100 and report["removed_faqs"] >= 100 and "real_ood" not in report
    assert set(report["answers_removed"]) == {"auroc", "threshold", "accuracy", "answered", "ood_abstained"}


def test_training_without_development_data_warns_and_keeps_the_model(tiny_encoder_dir, capsys):
    from medfaq.app.cmd_train import _calibrate_after_training

    _calibrate_after_training(tiny_encoder_dir)
    assert "warning: no abstention threshold stored" in capsys.readouterr().err
    assert not (tiny_encoder_dir / THRESHOLD_FILE).exists()


def test_calibrate_gives_an_index_built_before_the_threshold_it_would_have_inherited(
    tmp_path, tiny_encoder_dir, dev_data
):
    tuned = _set_up_biencoder(tiny_encoder_dir)
    faqs = tmp_path / "faqs.jsonl"
    faqs.write_text("\n".join(json.dumps({"id": str(i), "question": q}) for i, q in enumerate(BANK)) + "\n")
    before, other = tmp_path / "before", tmp_path / "other"
    runner = CliRunner()
    assert runner.invoke(app, ["index", "build", str(faqs), "--out", str(before)]).exit_code == 0
    assert runner.invoke(app, ["index", "build", str(faqs), "--out", str(other), "--encoder", str(tiny_encoder_dir)])
    assert read_config(before).active_threshold() is None  # built before the model was calibrated

    args = ["train", "calibrate", str(tuned), "--from", str(dev_data), "--index", str(before), "--index", str(other)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    stored = ModelThreshold.load(tuned)
    assert read_config(before).active_threshold() == stored.value
    assert read_config(before).inherited_thresholds == {"dense@raw": str(tuned / THRESHOLD_FILE)}
    assert f"warning: {other} left as it was" in result.stderr
    assert read_config(other).active_threshold() is None


def _faq_file(tmp_path: Path) -> Path:
    faqs = tmp_path / "faqs.jsonl"
    faqs.write_text("\n".join(json.dumps({"id": str(i), "question": q}) for i, q in enumerate(BANK)) + "\n")
    return faqs


def test_an_index_of_a_stock_encoder_inherits_its_shipped_threshold(tmp_path, tiny_encoder, monkeypatch):
    shipped = tmp_path / "stock_thresholds.json"
    monkeypatch.setattr(threshold_files, "STOCK_THRESHOLDS", shipped)
    stored = ModelThreshold(0.42, "dense@raw", "cosine", "minilm", "medquad", {}, {"in_scope": 4, "out_of_scope": 4})
    save_stock_threshold("minilm", tiny_encoder.fingerprint, stored, "python experiments/stock_thresholds.py", shipped)
    assert stock_threshold(tiny_encoder.fingerprint) == (stored, f"{shipped} (minilm)")
    assert stock_threshold("another fingerprint") is None

    out = tmp_path / "idx"
    result = CliRunner().invoke(
        app, ["index", "build", str(_faq_file(tmp_path)), "--out", str(out), "--encoder", tiny_encoder.name]
    )
    assert result.exit_code == 0, result.output
    assert "abstains below 0.4200 (dense@raw), the threshold inherited from the model" in result.stderr
    config = read_config(out)
    assert config.abstain and config.active_threshold() == 0.42
    assert config.inherited_thresholds == {"dense@raw": f"{shipped} (minilm)"}


def test_abstain_without_any_threshold_is_one_line(tmp_path, tiny_encoder_dir):
    out = tmp_path / "idx"
    runner = CliRunner()
    built = runner.invoke(
        app, ["index", "build", str(_faq_file(tmp_path)), "--out", str(out), "--encoder", str(tiny_encoder_dir)]
    )
    assert built.exit_code == 0, built.output
    result = runner.invoke(app, ["search", "--index", str(out), "--abstain", "what is the capital of france"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert result.stderr.startswith(f"error: --abstain needs a threshold, and {out} has none for dense@raw")
    given = runner.invoke(app, ["search", "--index", str(out), "--abstain", "--threshold", "2", "--json", "asthma"])
    assert given.exit_code == 0 and json.loads(given.stdout)["abstained"]


@pytest.mark.integration
def test_a_fresh_minilm_index_abstains_out_of_the_box(tmp_path):
    """Stock MiniLM (the first-run index's encoder) ships its threshold: off-topic questions abstain."""
    out = tmp_path / "idx"
    args = ["index", "build", str(_faq_file(tmp_path)), "--out", str(out), "--encoder", "minilm"]
    args += ["--encoder-backend", "torch"]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert read_config(out).inherited_thresholds["dense@raw"].endswith("stock_thresholds.json (minilm)")
    search = ["search", "--index", str(out), "--json", "--encoder-backend", "torch"]
    assert json.loads(CliRunner().invoke(app, [*search, "what is the capital of france"]).stdout)["abstained"]
    assert not json.loads(CliRunner().invoke(app, [*search, "what is asthma?"]).stdout)["abstained"]
