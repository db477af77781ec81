"""`medfaq setup --dry-run`: every step of the default pipeline and the demo with its measured time and command;
models already on disk are skipped, `--fast` leaves out the Gemma summarizer."""

from __future__ import annotations

from typer.testing import CliRunner

from medfaq.app.cli import app
from medfaq.common.runtime import models_dir


def dry_run(*flags: str) -> str:
    """The plan `medfaq setup --dry-run` prints: on stdout, so that it can be redirected to a file."""
    result = CliRunner().invoke(app, ["setup", "--dry-run", *flags])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    return result.stdout


def test_dry_run_lists_every_step_with_time_and_command():
    output = dry_run()
    assert "10 step(s) to run" in output
    commands = ("index build medquad", "train biencoder --task faq", "train summarizer --preset quick")
    assert "train question-writer --out " + str(models_dir() / "question-writer") in output
    for command in (*commands, "train crossencoder --task faq"):
        assert command in output
    # fine-tuned MPNet, the encoder the rule chose, encodes the MedQuAD index
    mpnet = str(models_dir() / "biencoder-mpnet-faq-quick")
    assert f"--init mpnet --out {mpnet}" in output and f"index build medquad --encoder {mpnet}" in output
    # the reranker is trained as a correction of that bi-encoder, which it keeps as its prior
    assert "--prior-scale 20 --negatives 7 --negatives-encoder " + str(models_dir() / "biencoder-faq-quick") in output
    assert "--backbone gemma-3-270m --variant mle" in output and "about 45 min" in output
    # the rank model continues the Gemma summarizer on medquad-chq's training part; then the index's decision
    rank = "--variant rank" in output and "--backbone " + str(models_dir() / "summarizer-gemma-quick") in output
    assert rank and "split-0/train/pairs.jsonl --out " + str(models_dir() / "summarizer-gemma-rank") in output
    assert "index likelihood " in output and "--measured-on " in output and "split-0/dev/qrels.tsv" in output


def test_present_models_are_skipped_and_fast_leaves_out_gemma():
    trained = models_dir() / "summarizer-ecl-quick"
    trained.mkdir(parents=True)
    (trained / "config.json").write_text("{}", encoding="utf-8")
    output = dry_run("--fast")
    assert "4 step(s) to run" in output
    assert "gemma" not in output.lower() and "mpnet" not in output
    assert "train summarizer --preset quick" not in output
    assert "index build medquad --encoder " + str(models_dir() / "biencoder-faq-quick") in output  # the MiniLM one


def test_the_demo_serves_the_fine_tuned_index_once_it_is_built(monkeypatch):
    from medfaq.app.setup_state import DemoSettings
    from medfaq.common.runtime import indexes_dir
    from medfaq.index.faq_index import MANIFEST

    monkeypatch.delenv("MEDFAQ_DEMO_INDEX", raising=False)
    settings = DemoSettings.from_env()
    assert settings.index_dir == indexes_dir() / "medquad-minilm"  # what the first step builds
    (indexes_dir() / "medquad-minilm").mkdir(parents=True)
    (indexes_dir() / "medquad-minilm" / MANIFEST).write_text("{}", encoding="utf-8")
    assert settings.index_dir.name == "medquad-minilm"
    (indexes_dir() / "medquad-faq").mkdir()
    (indexes_dir() / "medquad-faq" / MANIFEST).write_text("{}", encoding="utf-8")
    assert settings.index_dir.name == "medquad-faq"


def test_the_medquad_index_is_encoded_again_when_another_encoder_built_it(built_index, tiny_encoder_dir):
    import shutil

    from medfaq.common.runtime import indexes_dir

    mpnet = shutil.copytree(tiny_encoder_dir, models_dir() / "biencoder-mpnet-faq-quick")
    shutil.copytree(built_index, indexes_dir() / "medquad-faq")  # encoded by another encoder
    assert "Encode the MedQuAD index with the fine-tuned biencoder-mpnet-faq-quick" in dry_run()
    faqs = built_index.parent / "faqs.jsonl"
    command = ["index", "build", str(faqs), "--encoder", str(mpnet), "--out", str(indexes_dir() / "medquad-faq")]
    assert CliRunner().invoke(app, command).exit_code == 0
    output = dry_run()
    assert "Encode the MedQuAD index with the fine-tuned biencoder-mpnet-faq-quick: ready" in output
    assert "biencoder-mpnet-faq-quick: ready" in dry_run("--fast")  # --fast after a full set-up keeps MPNet
