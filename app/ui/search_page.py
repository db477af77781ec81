"""The search page: a consumer question in, the FAQ-style summary with its medical entities, ranked FAQ cards out."""

from __future__ import annotations

import html
import re
import uuid
from dataclasses import asdict, make_dataclass
from typing import Any

import streamlit as st

from medfaq.app.setup_state import EXAMPLE_LABELS, EXAMPLE_QUESTIONS
from medfaq.app.ui import common, resources
from medfaq.retriever.model_cache import shared_cache
from medfaq.retriever.pipeline import Pipeline, PipelineConfig, SearchResponse, pipeline_settings
from medfaq.retriever.queue.feedback import Feedback
from medfaq.retriever.search import Hit
from medfaq.retriever.stages import STAGES

MAX_PASTE_CHARS = 20_000
MIN_TEXT_SHARE = 0.85
MAX_RESULTS = 20  # the results slider's end: a page of cards (the API and the command line take up to top_k's bound)
MODE_LABELS = {"hybrid": "Hybrid (dense + BM25)", "dense": "Dense (MiniLM)", "bm25": "Keyword (BM25)"}
STAGE_LABELS = {
    "rerank_rrf": "reranker",
    "likelihood_rrf": "summary likelihood",
    "rerank": "reranker",
    "fusion": "question + summary",
    "rrf": "hybrid",
    "dense": "dense",
    "bm25": "BM25",
}
RANKING_STAGES = tuple(STAGE_LABELS)  # latest stage first
ENTITY_CLASSES = {"drug": "mf-drug", "disease": "mf-disease", "symptom": "mf-symptom"}


SWITCHED_STAGES = [stage for stage in STAGES if stage.demo is not None]  # the stages the sidebar switches
Controls = make_dataclass(
    "Controls",
    [*((stage.switch, bool) for stage in SWITCHED_STAGES), ("mode", str), ("top_k", int)],
    frozen=True,
)
Controls.__doc__ = """The request settings the sidebar offers by their flat names: the switch of each stage that
declares one in the demo (retriever/stages/), the mode and the number of results; the others stay as the index's
pipeline.json says (docs/demo.md)."""


def check_question(text: str, max_chars: int) -> tuple[str | None, str | None]:
    """(question, None) when usable, else (None, a friendly message for empty, binary or pasted-document input)."""
    text = (text or "").strip()
    if not text:
        return None, "Type a question first, or pick one of the examples."
    textual = sum((ch.isprintable() and ch != "\ufffd") or ch in "\n\t" for ch in text)
    if "\x00" in text or textual / len(text) < MIN_TEXT_SHARE or not re.search(r"\w", text):
        return None, "That doesn't look like a question written in text. Please type or paste plain text."
    if len(text) > MAX_PASTE_CHARS:
        return None, (
            f"That is {len(text):,} characters, far longer than a question. Please paste only the part you want "
            f"answered (the first {max_chars:,} characters are read)."
        )
    return text, None


def highlight(text: str, entities: list[Any]) -> str:
    """`text` as HTML with the recognised entities marked; spans that do not fit `text` are found by their words."""
    spans: dict[int, tuple[int, str]] = {}
    for entity in entities:
        if text[entity.start : entity.end] == entity.text:
            found = [(entity.start, entity.end)]
        else:
            found = [m.span() for m in re.finditer(rf"\b{re.escape(entity.text)}\b", text, flags=re.IGNORECASE)]
        for start, end in found:
            if not any(s < end and start < e for s, (e, _) in spans.items()):
                spans[start] = (end, entity.label)
    parts, position = [], 0
    for start in sorted(spans):
        end, label = spans[start]
        css = ENTITY_CLASSES.get(label, "mf-other")
        parts.append(html.escape(text[position:start]))
        parts.append(f'<mark class="mf-ent {css}">{html.escape(text[start:end])}<sub>{html.escape(label)}</sub></mark>')
        position = end
    parts.append(html.escape(text[position:]))
    return "".join(parts)


def hit_stage(hit: Hit) -> str:
    """The last pipeline stage that ranked the hit: the one whose score is the hit's score."""
    ranked = [name for name in RANKING_STAGES if hit.stage_scores.get(name) == hit.score]
    return ranked[0] if ranked else "retrieval"


def stage_switch(label: str, name: str, stage: str, notes: dict[str, str], ready: dict[str, bool], on: bool) -> bool:
    """The switch of the pipeline setting `name`, described by its declaration: enabled once the stage's model is
    ready, then on when the index's pipeline.json turns the stage on (`on`); the key changes when the model becomes
    ready, so the switch takes that default by itself."""
    return st.sidebar.toggle(
        label,
        value=ready[stage] and on,
        disabled=not ready[stage],
        key=f"ctl_{stage}_{'ready' if ready[stage] else 'missing'}",
        help=f"{pipeline_settings()[name].describe()} {stage}: {notes[stage]}",
    )


def controls(notes: dict[str, str], ready: dict[str, bool], base: PipelineConfig) -> Controls:
    """The sidebar's settings, starting from the index's pipeline.json (`base`), as `medfaq search` does."""
    st.sidebar.markdown("**Search settings**")
    settings = pipeline_settings()
    switches = {
        stage.switch: stage_switch(
            stage.demo.label, stage.switch, stage.demo.model, notes, ready, getattr(base, stage.switch)
        )
        for stage in SWITCHED_STAGES
    }
    modes = settings["mode"].setting.choices
    mode = st.sidebar.selectbox(
        "Search mode",
        modes,
        index=modes.index(base.mode),
        key="ctl_mode",
        format_func=MODE_LABELS.get,
        help=settings["mode"].describe(),
    )
    first, last = results_range()
    top_k = st.sidebar.slider("Results", first, last, 5, key="ctl_top_k", help=settings["top_k"].describe())
    return Controls(**switches, mode=mode, top_k=top_k)


def results_range() -> tuple[int, int]:
    """The results slider's ends: top_k's declared bounds, cut to `MAX_RESULTS`."""
    rule = pipeline_settings()["top_k"].setting
    return int(rule.ge), min(MAX_RESULTS, int(rule.le))


def build_pipeline(stages: resources.Stages, chosen: Controls, base: PipelineConfig, example: bool = False) -> Pipeline:
    """A pipeline over the shared index with the page's settings applied as the command line's flags are, its stages
    from the stage cache (those `ready_stages` loaded); abstention always on. For one of the page's `example`
    questions nothing goes to the experts' queue: they are not consumers' questions."""
    demo = resources.settings()
    config = base.with_flags(
        **asdict(chosen),
        # The cross-encoder reads the question itself: with the quick-preset summarizer, reranking against its
        # summary lowers Recall@1 (docs/results.md, "Retrieval pipeline").
        rerank_query="raw",
        entities=stages.entity_finder is not None,
        abstain=True,
        log_unanswered=base.log_unanswered and not example,
    )
    index = resources.faq_index(str(demo.index_dir), demo.index_stamp(), config.encoder_backend)
    return shared_cache().pipeline(index, config)


def _use_example() -> None:
    label = st.session_state.get("example")
    if label:
        st.session_state["question"] = EXAMPLE_QUESTIONS[EXAMPLE_LABELS.index(label)]
        st.session_state["submitted"] = True


def _submit() -> None:
    st.session_state["submitted"] = True


def search(pipeline: Pipeline, question: str, chosen: Controls, example: bool = False) -> None:
    """Run the pipeline (which records an abstained question in the expert queue, unless it is an `example`) and
    keep the response."""
    with st.spinner("Searching the FAQs…"):
        response = pipeline.run(question)
    st.session_state["result"] = {"response": response, "controls": chosen, "feedback": None, "example": example}


def _record_feedback(helpful: bool) -> None:
    result = st.session_state["result"]
    response: SearchResponse = result["response"]
    chosen: Controls = result["controls"]
    resources.feedback_store().add(
        Feedback(
            session=st.session_state.setdefault("session_id", uuid.uuid4().hex),
            question=response.query,
            helpful=helpful,
            summary=response.summary,
            abstained=response.abstained,
            hit_ids=[hit.id for hit in response.hits],
            settings=asdict(chosen),
        )
    )
    if not helpful and not response.abstained and not result["example"]:  # an abstained one is queued already
        resources.expert_queue().add(response.query, source="not helpful")
    result["feedback"] = "yes" if helpful else "no"


def summary_box(response: SearchResponse) -> None:
    if response.summary:
        label, text = "We read your question as", response.summary
    else:
        label, text = "Your question", response.query
    terms = dict.fromkeys((e.label, e.text.lower()) for e in response.entities)
    entities = "".join(f'<span class="mf-chip">{html.escape(kind)}: {html.escape(term)}</span>' for kind, term in terms)
    st.markdown(
        f'<div class="mf-summary"><div class="mf-label">{label}</div>'
        f'<div class="mf-text">{highlight(text, response.entities)}</div>'
        f'<div class="mf-meta">{"Medical terms: " + entities if entities else "No medical terms recognised."}</div>'
        "</div>",
        unsafe_allow_html=True,
    )


def stage_label(name: str) -> str:
    """e.g. ``rrf`` -> ``hybrid``, ``summary_dense`` -> ``summary dense``."""
    prefix, _, stage = name.rpartition("_")
    return f"{prefix} {STAGE_LABELS.get(stage, stage)}" if prefix else STAGE_LABELS.get(name, name)


def hit_card(hit: Hit) -> None:
    with st.container(border=True):
        left, right = st.columns([6, 1])
        source = html.escape(hit.source or "unknown source")
        link = f' · <a href="{html.escape(hit.url)}" target="_blank">{html.escape(hit.url)}</a>' if hit.url else ""
        chips = "".join(
            f'<span class="mf-chip">{html.escape(stage_label(name))} {score:.3f}</span>'
            for name, score in hit.stage_scores.items()
        )
        left.markdown(
            f'<div class="mf-question">{hit.rank}. {html.escape(hit.question)}</div>'
            f'<div class="mf-meta">{source}{link}</div><div class="mf-meta">{chips}</div>',
            unsafe_allow_html=True,
        )
        right.markdown(
            f'<div class="mf-score"><b>{hit.score:.3f}</b><br>{html.escape(stage_label(hit_stage(hit)))}</div>',
            unsafe_allow_html=True,
        )
        with st.expander("Answer"):
            st.markdown(html.escape(hit.answer) if hit.answer else "_This FAQ has no answer text._")
            st.caption(f"FAQ id {hit.id}")


def feedback_row(result: dict[str, Any]) -> None:
    if result["feedback"]:
        st.success("Thanks — your feedback was saved.", icon=":material/thumb_up:")
        return
    label, yes, no, _ = st.columns([2, 1, 1, 4], vertical_alignment="center")
    label.markdown("**Was this helpful?**")
    for column, helpful, label, icon in ((yes, True, "Yes", "thumb_up"), (no, False, "No", "thumb_down")):
        column.button(
            label,
            icon=f":material/{icon}:",
            key=f"helpful_{label.lower()}",
            on_click=_record_feedback,
            args=(helpful,),
            use_container_width=True,
        )


def results(result: dict[str, Any]) -> None:
    response: SearchResponse = result["response"]
    summary_box(response)
    sure = "" if response.confidence is None else f"confidence {response.confidence:.2f} · "
    timings = sure + " · ".join(f"{name} {ms:.0f} ms" for name, ms in response.timings_ms.items())
    if response.abstained:
        recorded = (
            "**No good match.** "
            if result["example"]
            else "**No good match — your question was recorded for an expert.** An expert will review it and may add "
            "a new FAQ. "
        )
        st.warning(
            recorded + "The closest FAQs we found are below, but they may not answer your question.",
            icon=":material/support_agent:",
        )
        with st.expander(f"Closest FAQs ({len(response.hits)})"):
            for hit in response.hits:
                hit_card(hit)
    elif not response.hits:
        st.info("No FAQ found.")
    else:
        st.markdown(
            f"**{len(response.hits)} matching FAQs** <span class='mf-meta'>{timings}</span>", unsafe_allow_html=True
        )
        for hit in response.hits:
            hit_card(hit)
    feedback_row(result)


def render() -> None:
    demo = resources.settings()
    runner = resources.setup_runner(demo)
    common.hero(
        "medfaq",
        "Ask a health question in your own words; we find the expert-written FAQs that answer it.",
        icon="stethoscope",
    )
    common.setup_panel(runner)
    stages = resources.ready_stages(demo)
    if not demo.index_ready():
        common.in_use_panel(demo, stages.notes)
        st.info("Search opens as soon as the FAQ index is built (see the progress above).")
        return
    ready = {"summarizer": stages.rewriter is not None, "reranker": stages.reranker is not None}
    ready["likelihood"] = ready["summarizer"]  # the same model, loaded when the switch is first turned on
    base = resources.base_config(demo)
    chosen = controls({**stages.notes, "likelihood": stages.notes["summarizer"]}, ready, base)
    common.in_use_panel(demo, stages.notes)

    st.pills("Try an example", EXAMPLE_LABELS, key="example", on_change=_use_example)
    with st.form("ask", border=False):
        st.text_area(
            "Your question",
            key="question",
            height=110,
            placeholder="e.g. I take ibuprofen for my back. Can I also take it with my blood pressure pills?",
        )
        st.form_submit_button("Search", type="primary", on_click=_submit)

    if st.session_state.pop("submitted", False):
        question, problem = check_question(st.session_state.get("question", ""), base.max_query_chars)
        if problem:
            st.session_state.pop("result", None)
            st.warning(problem, icon=":material/edit_note:")
        else:
            if len(question) > base.max_query_chars:
                st.info(f"Your question is long; the first {base.max_query_chars:,} characters are used.")
            example = question in EXAMPLE_QUESTIONS
            search(build_pipeline(stages, chosen, base, example), question, chosen, example)
    if "result" in st.session_state:
        results(st.session_state["result"])
