"""The expert queue: questions the pipeline abstained on, and the "Was this helpful?" answers, with exports."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from medfaq.app.ui import common, resources
from medfaq.retriever.unanswered import UnansweredLog

QUEUE_COLUMNS = ["time", "query", "summary", "best_score", "best_question", "best_id"]


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def exports(name: str, rows: list[dict], frame: pd.DataFrame) -> None:
    csv_col, jsonl_col, _ = st.columns([1, 1, 4])
    csv_col.download_button("Export CSV", frame.to_csv(index=False), f"{name}.csv", "text/csv", key=f"{name}_csv")
    jsonl_col.download_button("Export JSONL", jsonl(rows), f"{name}.jsonl", "application/jsonl", key=f"{name}_jsonl")


def render() -> None:
    common.hero("Expert queue", "Questions medfaq could not answer well enough — material for new FAQs.")
    log = UnansweredLog(resources.base_config(resources.settings()).unanswered_log)
    entries = list(reversed(log.read()))
    st.caption(f"{len(entries):,} unanswered question(s) · `{log.path}`")
    if entries:
        frame = pd.DataFrame(entries).reindex(columns=QUEUE_COLUMNS)
        st.dataframe(frame, hide_index=True, use_container_width=True)
        exports("unanswered", entries, frame)
    else:
        st.info("No unanswered questions yet: every question so far had a good match.")

    st.subheader("Was this helpful?")
    store = resources.feedback_store()
    feedback = store.rows()
    if not feedback:
        st.caption(f"No feedback yet · `{store.path}`")
        return
    helpful = sum(row["helpful"] for row in feedback)
    st.caption(f"{len(feedback):,} answers, {helpful:,} helpful ({helpful / len(feedback):.0%}) · `{store.path}`")
    frame = pd.DataFrame(feedback)[["created", "question", "helpful", "abstained", "summary", "hit_ids"]]
    st.dataframe(frame, hide_index=True, use_container_width=True)
    exports("feedback", feedback, frame)
