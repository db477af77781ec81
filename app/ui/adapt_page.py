"""Adapt the demo's index to its own FAQs (`medfaq index adapt`): what was adapted and on what numbers, a button that
starts a run (or its undo) in the background, and its progress while it runs."""

from __future__ import annotations

import streamlit as st

from medfaq.app.adaptation_job import AdaptationJob
from medfaq.app.ui import resources
from medfaq.common.runtime import MedfaqError
from medfaq.index.storage import read_manifest
from medfaq.retriever.decisions.adaptation import describe_adaptation


@st.cache_resource
def adaptation_job(index_dir: str) -> AdaptationJob:
    """One background run at a time per index, shared by every session of this server."""
    return AdaptationJob(index_dir)


def render() -> None:
    demo = resources.settings()
    st.title("Adapt this index to its FAQs")
    st.caption(
        "A question writer writes a consumer question for every FAQ; held back, they judge the FAQs' answers as extra "
        "rows, kept only where they do not lose. Written questions as rows, and an encoder tuned on them, need your "
        "labelled questions (`medfaq index adapt --dev-queries`). Undo removes all of it."
    )
    if not demo.index_ready():
        st.info("The FAQ index is not built yet.")
        return
    job = adaptation_job(str(demo.index_dir))
    state = job.status()
    manifest = read_manifest(demo.index_dir)
    st.markdown(f"**Now:** {describe_adaptation(manifest.adaptation, manifest.counts.get('records', 0))}")
    if state["state"] == "running":
        st.info(f"Running since {state['started']} ({state['action']}); reload the page to see how it went.")
    elif state["state"] == "failed":
        st.error(f"The last run failed: {state['error']}")
    elif state["state"] == "done":
        st.success(f"The last run ({state['action']}) finished at {state['finished']}.")
    running = state["state"] == "running"
    with st.form("adapt"):
        if st.form_submit_button("Adapt", disabled=running or bool(manifest.adaptation)):
            _start(job)
    if manifest.adaptation and st.button("Undo the adaptation", key="adapt_undo", disabled=running):
        _start(job, undo=True)


def _start(job: AdaptationJob, **settings) -> None:
    try:
        job.start(**settings)
    except MedfaqError as error:
        st.error(str(error))
        return
    st.rerun()
