"""Adapt the demo's index to its own FAQs (`medfaq index adapt`): what was adapted and on what numbers, a button that
starts a run (or its undo) in the background, and its progress while it runs."""

from __future__ import annotations

import streamlit as st

from medfaq.app.adaptation_job import AdaptationJob
from medfaq.app.ui import resources
from medfaq.common.runtime import MedfaqError
from medfaq.index.faq_index import read_manifest
from medfaq.retriever.adaptation import describe_adaptation
from medfaq.retriever.adaptation_config import PARTS, AdaptConfig


@st.cache_resource
def adaptation_job(index_dir: str) -> AdaptationJob:
    """One background run at a time per index, shared by every session of this server."""
    return AdaptationJob(index_dir)


def render() -> None:
    demo = resources.settings()
    st.title("Adapt this index to its FAQs")
    st.caption(
        "A question writer writes consumer questions for every FAQ; those that find their FAQ again are tried as "
        "extra rows, the FAQs' answers too, and an encoder tuned on this bank. Each part is kept only where it does "
        "not lose on held-back questions. Undo removes all of it."
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
        questions = st.slider("Questions written per FAQ", 1, 8, AdaptConfig.questions_per_faq, key="adapt_questions")
        parts = st.multiselect("Parts to try", list(PARTS), list(PARTS), key="adapt_parts")
        if st.form_submit_button("Adapt", disabled=running or bool(manifest.adaptation)):
            _start(job, questions_per_faq=questions, parts=parts)
    if manifest.adaptation and st.button("Undo the adaptation", key="adapt_undo", disabled=running):
        _start(job, undo=True)


def _start(job: AdaptationJob, **settings) -> None:
    try:
        job.start(**settings)
    except MedfaqError as error:
        st.error(str(error))
        return
    st.rerun()
