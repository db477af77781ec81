"""The results page: the latest evaluation and benchmark numbers (docs/results.md and JSON result files), plotted."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import streamlit as st

from medfaq.app.setup_state import REPO_ROOT
from medfaq.app.ui import common
from medfaq.common.runtime import medfaq_home

RESULTS_MD = REPO_ROOT / "docs" / "results.md"
CHART_HEIGHT = 240
NUMBER = re.compile(r"^[-+]?\d[\d,]*(\.\d+)?$")


def result_dirs() -> list[Path]:
    return [REPO_ROOT / "docs" / "results", REPO_ROOT / "results", medfaq_home() / "results"]


def sections(markdown: str) -> list[tuple[str, str]]:
    """(title, body) per ``## `` section."""
    parts = re.split(r"^## +(.+)$", markdown, flags=re.MULTILINE)
    return [(parts[i].strip(), parts[i + 1].strip()) for i in range(1, len(parts) - 1, 2)]


def _cell(text: str) -> str | float:
    plain = text.replace("**", "").replace("`", "").strip().rstrip("%").strip()
    return float(plain.replace(",", "")) if NUMBER.match(plain) else text.strip()


def tables(body: str) -> list[pd.DataFrame]:
    """The markdown tables of `body` whose columns after the first are numeric, indexed by the first column."""
    found = []
    for block in re.findall(r"(?:^\|.*\|[ \t]*\n?)+", body, flags=re.MULTILINE):
        rows = [[cell for cell in line.strip().strip("|").split("|")] for line in block.strip().splitlines()]
        if len(rows) < 4:  # header, separator, at least two rows to compare
            continue
        frame = pd.DataFrame([[_cell(c) for c in row] for row in rows[2:]], columns=[c.strip() for c in rows[0]])
        numeric = [c for c in frame.columns[1:] if all(isinstance(v, float) for v in frame[c])]
        if numeric:
            found.append(frame.set_index(frame.columns[0])[numeric].astype(float))
    return found


def numeric_leaves(data: object, prefix: str = "") -> dict[str, float]:
    """Flatten the numbers of a JSON document to ``{"a.b.c": value}``."""
    if isinstance(data, bool):
        return {}
    if isinstance(data, int | float):
        return {prefix or "value": float(data)}
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    leaves: dict[str, float] = {}
    for key, value in items:
        leaves.update(numeric_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return leaves


def json_results() -> None:
    found = (path for folder in result_dirs() if folder.is_dir() for path in folder.rglob("*.json"))
    files = sorted(found, key=lambda path: -path.stat().st_mtime)
    if not files:
        return
    st.subheader("Result files")
    for path in files:
        with st.expander(f"{path.name} · {path.parent}"):
            try:
                leaves = numeric_leaves(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, json.JSONDecodeError) as error:
                st.warning(f"cannot read {path}: {error}")
                continue
            frame = pd.DataFrame({"value": leaves}).rename_axis("metric")
            if 1 < len(frame) <= 40:
                st.bar_chart(frame, horizontal=True)
            st.dataframe(frame, use_container_width=True)


def render() -> None:
    common.hero("Results", "The latest measured evaluation and benchmark numbers, each with the command behind it.")
    if not RESULTS_MD.is_file():
        st.info(f"No results yet ({RESULTS_MD} is missing).")
    else:
        found = sections(RESULTS_MD.read_text(encoding="utf-8"))
        tabs = st.tabs([title for title, _ in found]) if found else []
        for tab, (_, body) in zip(tabs, found, strict=True):
            with tab:
                frames = tables(body)
                for row in range(0, len(frames), 2):
                    for column, frame in zip(st.columns(2), frames[row : row + 2], strict=False):
                        column.bar_chart(frame, horizontal=True, stack=False, height=CHART_HEIGHT)
                st.markdown(body)
    json_results()
