"""docs/cli.md is the reference the command tree writes of itself, so a changed option cannot leave it behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from medfaq.app.cli_reference import REGENERATE, cli_reference

CLI_MD = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


@pytest.mark.parametrize("columns", ["40", "250"])
def test_docs_cli_md_is_the_generated_reference(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)
    assert CLI_MD.read_text(encoding="utf-8") == cli_reference(), f"docs/cli.md is out of date: run `{REGENERATE}`"


def test_the_reference_names_every_command_and_option():
    reference = cli_reference()
    assert reference.startswith("# medfaq command-line reference\n") and REGENERATE in reference.splitlines()[2]
    for heading in ("### `medfaq search`", "#### `medfaq index build`", "#### `medfaq queue undo`"):
        assert heading in reference
    assert "- `--lock-timeout <float>`" in reference and "--help" not in reference.split("--help`.", 1)[1]
