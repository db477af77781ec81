"""One setting, one meaning, on every door: each setting a search request may set is declared once in PipelineConfig,
and the command line's flags, the HTTP API and the demo's widgets take it under that name, within those limits, with
that meaning; where a door offers less, its docs say so."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import demo_fakes
import pytest
import streamlit as st
from fastapi.testclient import TestClient
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from medfaq.app.cli import app as cli
from medfaq.app.server import REQUEST_SETTINGS, create_app
from medfaq.app.service import SearchService
from medfaq.app.ui.search_page import MODE_LABELS, Controls
from medfaq.common.runtime import MedfaqError
from medfaq.common.settings import Declared, check_setting
from medfaq.retriever.pipeline import pipeline_settings
from medfaq.retriever.pipeline_file import read_config, write_config

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app" / "streamlit_app.py")
QUESTION = "I started amoxicillin on Monday. Can I drink alcohol while taking amoxicillin?"
DEMO_WIDGETS = {  # the demo's widget of each setting it offers (the fields of its Controls)
    "summarize": "ctl_summarizer_ready",
    "rerank": "ctl_reranker_ready",
    "likelihood": "ctl_likelihood_ready",
    "mode": "ctl_mode",
    "top_k": "ctl_top_k",
}


@pytest.fixture
def index(tmp_path, tiny_encoder, monkeypatch) -> Path:
    """The demo's tiny index (its pipeline.json summarizes, fuses the summary with the question and reranks, with a
    threshold for that configuration) and stand-in models, its query encoder on ONNX Runtime on every door."""
    env = demo_fakes.build_demo_home(tmp_path / "home", tiny_encoder)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    demo_fakes.install(monkeypatch.setattr)
    directory = Path(env["MEDFAQ_DEMO_INDEX"])
    write_config(directory, read_config(directory).updated(encoder_backend="onnx"))
    st.cache_resource.clear()
    yield directory
    st.cache_resource.clear()


def samples(declared: Declared) -> tuple[list[Any], list[Any]]:
    """Values within the declaration's limits, and values outside them (a switch has none)."""
    rule = declared.setting
    if rule.choices:
        return list(rule.choices), ["nope"]
    if declared.kind is bool:
        return [True, False], []
    step = 1 if declared.kind is int else 0.5
    inside = [bound for bound in (rule.ge, rule.le) if bound is not None] or [step]
    outside = [rule.ge - step] if rule.ge is not None else []
    outside += [rule.le + step] if rule.le is not None else []
    outside += [float("nan")] if declared.kind is float else []
    return [declared.kind(value) for value in inside], [declared.kind(value) for value in outside]


def by_cli(index: Path, declared: Declared, value: Any):
    flag = declared.flag
    given = [flag if value else f"--no-{flag.removeprefix('--')}"] if declared.kind is bool else [f"{flag}={value}"]
    return CliRunner().invoke(cli, ["search", "--index", str(index), "--json", *given, QUESTION])


def by_http(client: TestClient, name: str, value: Any):
    body = json.dumps({"question": QUESTION, name: value})  # NaN as the NaN a JSON client may send
    return client.post("/search", content=body, headers={"content-type": "application/json"})


def gist(answer: dict[str, Any]) -> tuple[Any, ...]:
    top = sorted(answer["hits"][0]["stage_scores"]) if answer["hits"] else None
    return [hit["id"] for hit in answer["hits"]], answer["abstained"], answer["summary"], top


def refusal(declared: Declared, value: Any) -> str:
    with pytest.raises(MedfaqError) as refused:
        check_setting(declared, value)
    return str(refused.value)


def demo_takes(page: AppTest) -> dict[str, Any]:
    """For each setting the demo's sidebar offers, whether its widget can take a value."""
    slider = page.slider(key=DEMO_WIDGETS["top_k"])
    modes = {mode for mode, label in MODE_LABELS.items() if label in page.selectbox(key=DEMO_WIDGETS["mode"]).options}
    takes = {"top_k": lambda value: slider.min <= value <= slider.max, "mode": modes.__contains__}
    for name in ("summarize", "rerank", "likelihood"):
        assert not page.toggle(key=DEMO_WIDGETS[name]).disabled, name
        takes[name] = lambda value: isinstance(value, bool)
    return takes


def test_every_request_setting_has_one_name_limits_and_answer_on_every_door(index):
    """Each setting a request may set, sent in range and out of range as a command-line flag and as an HTTP request
    field, is answered alike (the same hits, or the same refusal in the declaration's words), and the demo's widget
    takes the in-range values it offers (its narrower results range is in docs/demo.md) and none of the others."""
    client = TestClient(create_app(SearchService(index, feedback_path=index.parent / "feedback.sqlite3")))
    schema = client.get("/openapi.json").json()["components"]["schemas"]["SearchRequest"]["properties"]
    page = AppTest.from_file(APP, default_timeout=60).run()
    demo = demo_takes(page)
    assert set(demo) == set(DEMO_WIDGETS) == {field.name for field in fields(Controls)} < set(REQUEST_SETTINGS)
    slider = page.slider(key=DEMO_WIDGETS["top_k"])
    assert f"{slider.min:g} to {slider.max:g}" in (ROOT / "docs" / "demo.md").read_text(encoding="utf-8")
    assert set(REQUEST_SETTINGS) == {name for name, declared in pipeline_settings().items() if declared.setting.request}
    for name, declared in REQUEST_SETTINGS.items():
        rule, [documented, _] = declared.setting, schema[name]["anyOf"]
        assert (documented.get("minimum"), documented.get("maximum")) == (rule.ge, rule.le), name
        assert tuple(documented.get("enum", ())) == rule.choices, name
        inside, outside = samples(declared)
        for value in inside:
            on_cli, on_http = by_cli(index, declared, value), by_http(client, name, value)
            assert on_cli.exit_code == 0 and on_http.status_code == 200, (name, value, on_cli.stderr, on_http.text)
            assert gist(json.loads(on_cli.stdout)) == gist(on_http.json()), (name, value)
            if name in demo:
                assert demo[name](value) or (name == "top_k" and value > slider.max), (name, value)
        for value in outside:
            on_cli, on_http, words = (
                by_cli(index, declared, value),
                by_http(client, name, value),
                refusal(declared, value),
            )
            assert on_cli.exit_code == 2 and words in on_cli.stderr, (name, value, on_cli.stderr)
            assert on_http.status_code == 422 and on_http.json()["detail"] == f"{name}: {words}", (name, on_http.text)
            assert name not in demo or not demo[name](value), (name, value)


def test_summarizing_alone_fuses_the_summary_with_the_question_on_every_door(index):
    """``summarize`` set alone over a config that searches with the raw question means the same everywhere: the
    question and its summary fused (the command line and the API searched with the summary alone)."""
    write_config(index, read_config(index).updated(summarize=False, query_source="raw", rerank=False))
    on_cli = json.loads(
        CliRunner().invoke(cli, ["search", "--index", str(index), "--json", "--summarize", QUESTION]).stdout
    )
    client = TestClient(create_app(SearchService(index, feedback_path=index.parent / "feedback.sqlite3")))
    on_http = client.post("/search", json={"question": QUESTION, "summarize": True}).json()
    for answer in (on_cli, on_http):
        assert answer["summary"] and "fusion" in answer["hits"][0]["stage_scores"]
    assert gist(on_cli) == gist(on_http)
    page = AppTest.from_file(APP, default_timeout=60).run()
    page.toggle(key=DEMO_WIDGETS["summarize"]).set_value(True)
    page.text_area(key="question").input(QUESTION)
    page.button(key="FormSubmitter:ask-Search").click().run()
    shown = "\n".join(element.value for element in page.main.markdown)
    assert "We read your question as" in shown and "question + summary" in shown


def test_each_door_s_docs_name_what_it_leaves_out():
    """The API's /search row names every request setting, and every other flag of `medfaq search` with why it is
    kept off HTTP; the demo's page names the request settings its sidebar does not offer."""
    settings = pipeline_settings()
    api = (ROOT / "docs" / "http-api.md").read_text(encoding="utf-8")
    [search_row] = [line for line in api.splitlines() if line.startswith("| `POST /search`")]
    flagged = [name for name, declared in settings.items() if declared.flag or declared.setting.request]
    assert [name for name in flagged if f"`{name}`" not in search_row] == []
    demo = (ROOT / "docs" / "demo.md").read_text(encoding="utf-8")
    assert [name for name in REQUEST_SETTINGS if f"`{name}`" not in demo] == []
    assert "`--query-source`" in (ROOT / "docs" / "pipeline.md").read_text(encoding="utf-8")
