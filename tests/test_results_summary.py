"""The summary at the top of docs/results.md: its numbers file is complete, its figure is drawn from it, and both
report the real FAQ banks first, apart from the summary-matching sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.results_summary import format_summary, results_summary_plot
from medfaq.common.runtime import MedfaqError

DOCS = Path(__file__).resolve().parents[1] / "docs"
SUMMARY = DOCS / "results" / "summary.json"


def sources(data: object) -> list[str]:
    """Every `source` of the summary: the title of the section (results.md or experiments/) its numbers come from."""
    if not isinstance(data, dict):
        return []
    found = [data["source"]] if "source" in data else []
    return found + [source for value in data.values() for source in sources(value)]


def test_every_number_cites_a_section_and_every_stage_covers_every_benchmark():
    summary = json.loads(SUMMARY.read_text(encoding="utf-8"))
    pages = [DOCS / "results.md", *(DOCS / "experiments").glob("*.md")]
    headings = {line.lstrip("#").strip() for page in pages for line in page.read_text(encoding="utf-8").splitlines()}
    assert set(sources(summary)) - headings == set()
    benchmarks = set(summary["default_pipeline"]["benchmarks"])
    for name, stage in summary["stage_gains"]["stages"].items():
        assert set(stage["delta"]) == benchmarks, name


def test_the_figure_is_drawn_from_the_summary(tmp_path):
    out = results_summary_plot(SUMMARY, tmp_path / "figures" / "summary.png")
    assert out.read_bytes().startswith(b"\x89PNG")
    with pytest.raises(MedfaqError, match="not found"):
        results_summary_plot(tmp_path / "missing.json", tmp_path / "x.png")


def test_the_summary_reports_real_banks_first_under_the_heading_of_their_kind():
    text = format_summary(SUMMARY)
    real, summary = text.index("== Real FAQ banks: the evidence for defaults =="), text.index("== Summary-matching")
    assert real < text.index("\nquebec ") < summary < text.index("\nmeqsum ") and "not evidence for defaults" in text
