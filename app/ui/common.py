"""Page furniture shared by the demo's pages: styles, the "in use" panel and the set-up progress panel."""

from __future__ import annotations

import html
import re

import streamlit as st

from medfaq.app.setup_state import DemoSettings, SetupRunner, SetupStep
from medfaq.index.storage import read_manifest

STYLE = """
<style>
.block-container {padding-top: 2.2rem; max-width: 1100px;}
.st-key-mf-hero h1 {font-size: 2.1rem; margin-bottom: 0; color: #0f4c5c;}
.st-key-mf-hero p {color: #475569; margin-top: .2rem; font-size: 1.02rem;}
.mf-summary {background: #f0fdfa; border: 1px solid #99f6e4; border-radius: .6rem; padding: .9rem 1.1rem;
  margin: .4rem 0 1rem 0;}
.mf-summary .mf-label {font-size: .78rem; text-transform: uppercase; letter-spacing: .06em; color: #0f766e;}
.mf-summary .mf-text {font-size: 1.25rem; font-weight: 600; color: #0f172a; margin-top: .2rem;}
.mf-question {font-size: 1.05rem; font-weight: 600; color: #0f172a;}
.mf-meta {font-size: .85rem; color: #64748b;}
.mf-meta a {color: #0f766e;}
.mf-score {text-align: right; font-size: .85rem; color: #334155;}
.mf-score b {font-size: 1.15rem; color: #0f172a;}
.mf-chip {display: inline-block; background: #f1f5f9; border-radius: 1rem; padding: 0 .55rem; margin: .1rem .15rem;
  font-size: .75rem; color: #334155;}
mark.mf-ent {border-radius: .3rem; padding: 0 .25rem; color: #0f172a;}
mark.mf-ent sub {font-size: .62rem; font-weight: 500; margin-left: .2rem; color: #475569; text-transform: uppercase;}
mark.mf-drug {background: #dbeafe;}
mark.mf-disease {background: #fee2e2;}
mark.mf-symptom {background: #fef3c7;}
mark.mf-other {background: #ede9fe;}
.mf-status {font-size: .85rem; line-height: 1.5;}
.mf-status code {font-size: .78rem;}
</style>
"""
PERCENT = re.compile(r"(\d{1,3})%\|")  # a tqdm bar in a step's latest output line
# Material icons, drawn by Streamlit's own font: emoji need a colour emoji font, which many Linux browsers lack
STATUS_ICONS = {
    "done": ":material/check_circle:",
    "running": ":material/progress_activity:",
    "pending": ":material/schedule:",
    "failed": ":material/error:",
    "skipped": ":material/pause_circle:",
}


def apply_style() -> None:
    st.markdown(STYLE, unsafe_allow_html=True)


def hero(title: str, tagline: str, icon: str | None = None) -> None:
    """The page's title, after the Material icon `icon` (e.g. ``stethoscope``) when given, and its tagline."""
    with st.container(key="mf-hero"):
        st.markdown(f"# :material/{icon}: {title}" if icon else f"# {title}")
        st.markdown(tagline)


def index_line(demo: DemoSettings) -> str:
    """e.g. ``medquad-minilm · 47,441 FAQs · encoder minilm``."""
    if not demo.index_ready():
        return f"{demo.index_dir.name} (not built yet)"
    manifest = read_manifest(demo.index_dir)
    return f"{demo.index_dir.name} · {manifest.counts.get('records', 0):,} FAQs · encoder {manifest.encoder}"


def in_use_panel(demo: DemoSettings, notes: dict[str, str]) -> None:
    """The sidebar box that always says which index and models the page uses."""
    from medfaq.retriever.decisions import likelihood_choice, reranker_choice
    from medfaq.retriever.decisions.stage_choice import development_line

    rows = [("Index", index_line(demo)), *((name.capitalize(), note) for name, note in notes.items())]
    decisions = {"Likelihood stage": likelihood_choice, "Reranker": reranker_choice}  # `medfaq index likelihood|rerank`
    for label, decision in decisions.items():
        choice = decision.read_choice(demo.index_dir)
        if choice is not None:
            rows.append((label, f"{'on' if choice['on'] else 'off'} · {development_line(choice)}"))
    items = "".join(f"<div><b>{html.escape(k)}</b>: {html.escape(v)}</div>" for k, v in rows)
    st.sidebar.divider()
    st.sidebar.markdown("**In use**")
    st.sidebar.markdown(f'<div class="mf-status">{items}</div>', unsafe_allow_html=True)
    st.sidebar.caption(f"Index directory: `{demo.index_dir}`")


def _step_line(step: SetupStep) -> str:
    minutes, seconds = divmod(int(step.elapsed()), 60)
    took = f" · {minutes}:{seconds:02d}" if step.started else ""
    if step.status in {"pending", "running"} and step.minutes:
        took += f" of about {step.minutes:g} min" if step.started else f" · about {step.minutes:g} min"
    return f"{STATUS_ICONS[step.status]} **{step.title}**{took} — {step.detail or step.status}"


def setup_panel(runner: SetupRunner) -> None:
    """Set-up progress; refreshes itself every 2 s while a step runs, and reruns the page when one finishes."""
    before = {step.key: step.status for step in runner.steps()}

    @st.fragment(run_every=2.0 if runner.busy() else None)
    def panel() -> None:
        steps = runner.steps()
        if any(before[step.key] != step.status for step in steps):
            st.rerun()
        with st.container(border=True):
            st.markdown("**Setting up medfaq**" + (" — this runs once" if runner.busy() else ""))
            for step in steps:
                st.markdown(_step_line(step))
                percent = PERCENT.search(step.detail) if step.status == "running" else None
                if percent:
                    st.progress(int(percent.group(1)))
                if step.status in {"pending", "running", "failed"}:
                    st.caption(f"`{step.shown_command}` — log: `{runner.log_path(step)}`")

    if runner.busy() or any(status == "failed" for status in before.values()):
        panel()
