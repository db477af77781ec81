"""`medfaq setup --dry-run`: every step of the default pipeline and the demo with its measured time and command;
models already on disk are skipped, `--fast` leaves out the Gemma summarizer."""

from __future__ import annotations

from typer.testing import CliRunner

from app.cli import app
from index.runtime import models_dir


def dry_run(*flags: str) -> str:
    result = CliRunner().invoke(app, ["setup", "--dry-run", *flags])
    assert result.exit_code == 0, result.output
    return result.output


def test_dry_run_lists_every_step_with_time_and_command():
    output = dry_run()
    assert "4 step(s) to run" in output
    for command in ("index build medquad", "train summarizer --preset quick", "train crossencoder --task faq"):
        assert command in output
    assert "--backbone gemma-3-270m --variant mle" in output and "about 45 min" in output


def test_present_models_are_skipped_and_fast_leaves_out_gemma():
    trained = models_dir() / "summarizer-ecl-quick"
    trained.mkdir(parents=True)
    (trained / "config.json").write_text("{}", encoding="utf-8")
    output = dry_run("--fast")
    assert "2 step(s) to run" in output
    assert "gemma" not in output.lower()
    assert "train summarizer --preset quick" not in output
