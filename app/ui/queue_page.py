"""The expert queue: the questions the pipeline abstained on, grouped, for an expert to answer each group once
(link it to an FAQ, or write a new one from the summarizer's title); split, merge and undo; then the log and the
"Was this helpful?" answers, with exports."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from medfaq.app.ui import common, resources
from medfaq.common.runtime import MedfaqError
from medfaq.retriever.queue.question_queue import QuestionGroup, QuestionQueue
from medfaq.retriever.queue.unanswered import UnansweredLog

QUEUE_COLUMNS = ["time", "query", "summary", "best_score", "best_question", "best_id"]


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def exports(name: str, rows: list[dict], frame: pd.DataFrame) -> None:
    csv_col, jsonl_col, _ = st.columns([1, 1, 4])
    csv_col.download_button("Export CSV", frame.to_csv(index=False), f"{name}.csv", "text/csv", key=f"{name}_csv")
    jsonl_col.download_button("Export JSONL", jsonl(rows), f"{name}.jsonl", "application/jsonl", key=f"{name}_jsonl")


def _act(action, *args, done: str) -> None:
    """Run an expert's change; its outcome (or its one-line error) is shown after the page reloads."""
    try:
        action(*args)
        st.session_state["queue_notice"] = ("success", done)
    except MedfaqError as error:
        st.session_state["queue_notice"] = ("error", str(error))


def _waiting_group(queue: QuestionQueue, group: QuestionGroup, others: list[QuestionGroup]) -> None:
    with st.expander(f"{group.title} — asked {group.count}×", expanded=group.count > 1 or len(others) < 5):
        for question in group.questions:
            st.markdown(
                f"- {question.text}  \n  <small>#{question.id} · {question.asked}</small>", unsafe_allow_html=True
            )
        answer_tab, link_tab, edit_tab = st.tabs(["Answer with a new FAQ", "Link to an FAQ", "Split or merge"])
        with answer_tab, st.form(f"answer-{group.id}"):
            question = st.text_input("FAQ question", value=group.title, key=f"q-{group.id}")
            answer = st.text_area("Answer", key=f"a-{group.id}")
            by = st.text_input("Your name", key=f"by-{group.id}")
            if st.form_submit_button("Add this FAQ"):
                _act(queue.answer, group.id, question, answer, by, done=f"Added a new FAQ for “{question}”.")
                st.rerun()
        with link_tab, st.form(f"link-{group.id}"):
            faq_id = st.text_input("FAQ id (see the search page's results)", key=f"faq-{group.id}")
            by = st.text_input("Your name", key=f"link-by-{group.id}")
            if st.form_submit_button("Link"):
                _act(queue.link, group.id, faq_id.strip(), by, done=f"Linked to FAQ {faq_id}.")
                st.rerun()
        with edit_tab:
            labels = {f"#{q.id} {q.text}": q.id for q in group.questions}
            moving = st.multiselect("Questions to move to a new group", list(labels), key=f"split-{group.id}")
            if st.button("Split", key=f"split-button-{group.id}", disabled=not moving):
                _act(queue.split, group.id, [labels[m] for m in moving], done="Split into a new group.")
                st.rerun()
            names = {f"{other.title} (#{other.id})": other.id for other in others if other.id != group.id}
            joining = st.multiselect("Groups that ask the same question", list(names), key=f"merge-{group.id}")
            if st.button("Merge", key=f"merge-button-{group.id}", disabled=not joining):
                _act(queue.merge, [group.id, *(names[j] for j in joining)], done="Merged.")
                st.rerun()


def render_groups() -> None:
    queue = resources.expert_queue()
    notice = st.session_state.pop("queue_notice", None)
    if notice:
        getattr(st, notice[0])(notice[1])
    waiting = queue.groups()
    st.subheader(f"Waiting: {len(waiting)} group(s) of questions")
    if not waiting:
        st.info("Nothing waits for an expert: every question so far had a good match, or was answered.")
    for group in waiting:
        _waiting_group(queue, group, waiting)
    resolved = [group for group in queue.groups(None) if group.status != "waiting"]
    if resolved:
        st.subheader("Answered")
        for group in resolved:
            left, right = st.columns([5, 1])
            left.markdown(f"**{group.title}** — {group.count} question(s) → FAQ `{group.faq_id}` ({group.status})")
            if right.button("Undo", key=f"undo-{group.id}"):
                _act(queue.undo, group.id, done=f"Undone: group {group.id} waits again.")
                st.rerun()


def render() -> None:
    common.hero("Expert queue", "Questions medfaq could not answer well enough, grouped: answer each group once.")
    render_groups()
    st.subheader("Unanswered-questions log")
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
