"""The Streamlit demo under AppTest: a tiny index from the tiny encoder, word-overlap stand-ins for the models."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import demo_fakes
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from medfaq.app.setup_state import EXAMPLE_QUESTIONS, DemoSettings, SetupRunner, SetupStep, default_steps
from medfaq.app.ui.search_page import MODE_LABELS
from medfaq.retriever.pipeline import pipeline_settings
from medfaq.retriever.pipeline_file import read_config, write_config
from medfaq.retriever.queue.feedback import Feedback, FeedbackStore
from medfaq.retriever.queue.unanswered import UnansweredLog

APP = str(Path(__file__).resolve().parents[1] / "app" / "streamlit_app.py")
QUESTION = "I started amoxicillin on Monday for a chest infection. Can I drink alcohol while taking amoxicillin?"
TIMEOUT_S = 60


@pytest.fixture
def demo_env(tmp_path, tiny_encoder, monkeypatch):
    """Environment of a demo over a tiny index with stand-in models; caches cleared around each test."""
    env = demo_fakes.build_demo_home(tmp_path / "home", tiny_encoder)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    demo_fakes.install(monkeypatch.setattr)
    st.cache_resource.clear()
    yield env
    st.cache_resource.clear()


def ask(question: str) -> AppTest:
    app = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    app.text_area(key="question").input(question)
    app.button(key="FormSubmitter:ask-Search").click().run()
    assert not app.exception
    return app


def markdown(app: AppTest) -> str:
    return "\n".join(element.value for element in app.main.markdown)


def test_search_shows_summary_entities_ranked_cards_and_stores_feedback(demo_env):
    app = ask(QUESTION)
    page = markdown(app)
    assert "We read your question as" in page
    assert '<mark class="mf-ent mf-drug">amoxicillin<sub>drug</sub></mark>' in page
    assert page.index("1. Can I drink alcohol while taking amoxicillin?") < page.index("2. ")
    assert "https://example.org/faq/f1" in page and "reranker" in page
    assert "No good match" not in page
    assert [e.label for e in app.expander][:2] == ["Answer", "Answer"]
    in_use = "\n".join(element.value for element in app.sidebar.markdown)
    assert "tiny · 6 FAQs" in in_use and "<b>Summarizer</b>: summarizer" in in_use

    app.button(key="helpful_no").click().run()
    assert "feedback was saved" in app.success[0].value
    [stored] = FeedbackStore().all()
    assert (stored.question, stored.helpful, stored.hit_ids[0]) == (QUESTION, False, "f1")
    expected = {"summarize": True, "rerank": True, "likelihood": False, "mode": "dense", "top_k": 5}
    assert stored.settings == expected  # the default mode; the summary likelihood is off by default
    from medfaq.app.ui import resources

    [waiting] = resources.expert_queue().groups()  # an answer that did not help: its question waits too
    assert [(q.text, q.source) for q in waiting.questions] == [(QUESTION, "not helpful")]


def test_the_sidebar_shows_the_indexs_likelihood_and_reranker_decisions(demo_env):
    from medfaq.retriever.decisions import likelihood_choice, reranker_choice

    development = {"labelled": {"questions": 140, "before": {"recall@1": 60.0}, "delta_r1": 6.4}}
    likelihood_choice.write_choice(Path(demo_env["MEDFAQ_DEMO_INDEX"]), {"on": True, "development": development})
    development = {"labelled": {"questions": 140, "before": {"recall@1": 66.4}, "delta_r1": 0.0}}
    reranker_choice.write_choice(Path(demo_env["MEDFAQ_DEMO_INDEX"]), {"on": False, "development": development})
    app = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    in_use = "\n".join(element.value for element in app.sidebar.markdown)
    assert "<b>Likelihood stage</b>: on · labelled R@1 60.0 -&gt; 66.4 (140 questions)" in in_use
    assert "<b>Reranker</b>: off · labelled R@1 66.4 -&gt; 66.4 (140 questions)" in in_use


def test_the_page_draws_material_icons_not_emoji(demo_env):
    """Emoji need a colour emoji font (Debian's Chromium draws empty boxes without one); Material icons do not."""
    app = ask(QUESTION)
    assert "# :material/stethoscope: medfaq" in markdown(app)
    assert [app.button(key=key).proto.icon for key in ("helpful_yes", "helpful_no")] == [
        ":material/thumb_up:",
        ":material/thumb_down:",
    ]
    sources = [Path(APP), *(Path(APP).parent / "ui").glob("*.py")]
    emoji = re.compile("[\U0001f300-\U0001faff\u2600-\u27bf]")
    assert [path.name for path in sources if emoji.search(path.read_text(encoding="utf-8"))] == []


def test_controls_switch_stages_and_mode(demo_env):
    app = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    app.toggle(key="ctl_summarizer_ready").set_value(False)
    app.toggle(key="ctl_reranker_ready").set_value(False)
    settings = pipeline_settings()  # each widget is described by its setting's declaration
    assert app.toggle(key="ctl_reranker_ready").help.startswith(settings["rerank"].describe())
    assert app.selectbox(key="ctl_mode").options == [MODE_LABELS[mode] for mode in settings["mode"].setting.choices]
    assert app.selectbox(key="ctl_mode").help == settings["mode"].describe()
    assert app.slider(key="ctl_top_k").min == settings["top_k"].setting.ge
    app.selectbox(key="ctl_mode").set_value("bm25")
    app.slider(key="ctl_top_k").set_value(2)
    app.text_area(key="question").input("what are the symptoms of diabetes")
    app.button(key="FormSubmitter:ask-Search").click().run()
    page = markdown(app)
    assert "Your question" in page and "We read your question as" not in page
    assert "1. What are the symptoms of type 2 diabetes?" in page and "3. " not in page
    assert "BM25" in page and "reranker" not in page


def test_stages_start_as_the_index_pipeline_json_says(demo_env):
    index = demo_env["MEDFAQ_DEMO_INDEX"]
    write_config(index, read_config(index).updated(summarize=False, query_source="raw", rerank=False))
    app = ask(QUESTION)
    switches = [app.toggle(key=f"ctl_{stage}_ready") for stage in ("summarizer", "reranker", "likelihood")]
    assert [(switch.value, switch.disabled) for switch in switches] == [(False, False)] * 3  # ready, off
    page = markdown(app)
    assert "We read your question as" not in page and "reranker" not in page
    assert "1. Can I drink alcohol while taking amoxicillin?" in page


def test_the_page_applies_the_threshold_of_the_configuration_that_ran(demo_env):
    saved = read_config(demo_env["MEDFAQ_DEMO_INDEX"])
    assert list(saved.thresholds) == [demo_fakes.page_default_config().threshold_key]
    assert "No good match" in ask("Xylophone lessons near Zanzibar?").warning[0].value  # calibrated: abstains
    app = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    app.toggle(key="ctl_reranker_ready").set_value(False)  # another configuration, never calibrated
    app.text_area(key="question").input("Xylophone lessons near Zanzibar?")
    app.button(key="FormSubmitter:ask-Search").click().run()
    assert not app.exception and not app.warning and "1. " in markdown(app)


def test_example_question_searches_at_once(demo_env):
    app = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    app.button_group(key="example").set_value("Alcohol & amoxicillin").run()
    assert app.text_area(key="question").value == EXAMPLE_QUESTIONS[0]
    assert "We read your question as" in markdown(app) and "Was this helpful?" in markdown(app)


def test_example_questions_never_reach_the_expert_queue(demo_env):
    from medfaq.app.ui import resources
    from medfaq.retriever.pipeline_file import store_threshold

    store_threshold(demo_env["MEDFAQ_DEMO_INDEX"], demo_fakes.page_default_config(), 2.0)  # every question abstains
    app = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    app.button_group(key="example").set_value("Alcohol & amoxicillin").run()
    assert app.warning[0].value.startswith("**No good match.** The closest FAQs")
    app.button(key="helpful_no").click().run()
    assert "feedback was saved" in app.success[0].value
    assert UnansweredLog().read() == [] and resources.expert_queue().groups() == []


def test_abstained_question_is_recorded_and_listed_in_the_expert_queue(demo_env):
    app = ask("Xylophone lessons near Zanzibar?")
    assert "No good match — your question was recorded for an expert." in app.warning[0].value
    [entry] = UnansweredLog().read()
    assert entry["query"] == "Xylophone lessons near Zanzibar?"

    queue = AppTest.from_string(
        "from medfaq.app.ui import queue_page\nqueue_page.render()", default_timeout=TIMEOUT_S
    ).run()
    assert not queue.exception
    assert list(queue.dataframe[0].value["query"]) == ["Xylophone lessons near Zanzibar?"]
    assert [button.proto.label for button in queue.get("download_button")] == ["Export CSV", "Export JSONL"]
    [group] = queue.expander
    assert group.label == "Xylophone lessons near Zanzibar? — asked 1×"  # titled by the (stand-in) summarizer
    assert queue.text_input(key="q-1").value == "Xylophone lessons near Zanzibar?"  # the title, to start from
    queue.text_input(key="q-1").input("Where can I take xylophone lessons in Zanzibar?")
    queue.text_area(key="a-1").input("At the Zanzibar music school.")
    queue.button(key="FormSubmitter:answer-1-Add this FAQ").click().run()
    assert not queue.exception and "Added a new FAQ" in queue.success[0].value
    assert not queue.expander  # nothing waits; the group is listed as answered, with an undo button
    assert [button.label for button in queue.button if button.key == "undo-1"] == ["Undo"]
    answered = ask("Xylophone lessons near Zanzibar?")
    assert not answered.warning and "Where can I take xylophone lessons in Zanzibar?" in markdown(answered)


@pytest.mark.parametrize(
    ("question", "message"),
    [
        ("   ", "Type a question first"),
        ("\x00\x01\x02\x03 \x04\x05\x06\x07", "doesn't look like a question"),
        ("PK\x03\x04" + "\ufffd" * 40 + "word/document.xml", "doesn't look like a question"),
        ("is this too long? " * 2000, "far longer than a question"),
    ],
)
def test_bad_input_gets_a_friendly_message(demo_env, question, message):
    app = ask(question)
    assert message in app.warning[0].value
    assert "matching FAQs" not in markdown(app)


def test_long_question_is_cut_with_a_note(demo_env):
    app = ask("Can I drink alcohol while taking amoxicillin? " * 100)
    assert "first 2,000 characters are used" in app.info[0].value
    assert "1. Can I drink alcohol while taking amoxicillin?" in markdown(app)


def test_page_shows_set_up_progress_until_the_index_exists(demo_env, monkeypatch):
    monkeypatch.delenv("MEDFAQ_DEMO_INDEX")  # the default index, built by the first set-up step
    monkeypatch.setattr(SetupRunner, "start", lambda self: None)
    app = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    assert not app.exception
    page = markdown(app)
    assert (
        "Fetch MedQuAD and build the FAQ index" in page
        and "medfaq index build medquad --synonyms none --out" in "\n".join(caption.value for caption in app.caption)
    )
    assert "Search opens as soon as the FAQ index is built" in app.info[0].value
    assert "medquad-minilm (not built yet)" in "\n".join(element.value for element in app.sidebar.markdown)


def test_a_mistyped_demo_index_is_an_error_not_a_build(demo_env, tmp_path, monkeypatch):
    from medfaq.app import cmd_demo
    from medfaq.app.cli import app as cli
    from medfaq.index import datasets

    typo = tmp_path / "indxe"
    monkeypatch.setenv("MEDFAQ_DEMO_INDEX", str(typo))
    monkeypatch.setattr(SetupRunner, "start", lambda self: pytest.fail("set-up started"))
    monkeypatch.setattr(datasets, "fetch_dataset", lambda *_: pytest.fail("MedQuAD fetched"))
    monkeypatch.setattr(cmd_demo, "run_until_stopped", lambda *_: pytest.fail("the demo served"))
    app = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    assert not app.exception and app.error[0].value.startswith(f"error: MEDFAQ_DEMO_INDEX={typo} holds no built index")
    for args in (["demo"], ["demo", "--cli"], ["setup", "--dry-run"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2 and result.stderr.startswith(f"error: MEDFAQ_DEMO_INDEX={typo} holds no"), args


def test_default_steps_skip_what_exists_and_respect_no_train(demo_env, monkeypatch):
    assert [step.key for step in default_steps(DemoSettings.from_env())] == ["index", "biencoder-mpnet", "index-faq"]
    ready = DemoSettings.from_env(everything=True)
    steps = default_steps(ready)
    keys = ["index", "biencoder", "biencoder-mpnet", "index-faq", "summarizer-ecl", "reranker", "question-writer"]
    assert [step.key for step in steps] == [*keys, "summarizer-gemma", "summarizer-rank"]
    # a custom index and summarizer: the bi-encoders, their index and the Gemma steps are switched off; the question
    # writer (of the Adapt page) is not trained while training is off
    assert [step.status for step in steps] == ["done"] * 6 + ["skipped"] + ["done"] * 2
    assert not SetupRunner(ready).busy()
    monkeypatch.setenv("MEDFAQ_DEMO_RERANKER", "reranker-not-trained")
    statuses = {step.key: step.status for step in default_steps(DemoSettings.from_env(everything=True))}
    assert statuses["reranker"] == "skipped" and statuses["index"] == "done"
    monkeypatch.setenv("MEDFAQ_DEMO_NO_TRAIN", "0")
    [rerank] = [step for step in default_steps(DemoSettings.from_env(everything=True)) if step.key == "reranker"]
    assert rerank.status == "pending" and rerank.minutes > 0
    final = rerank.commands[-1]  # after the data fetches: one training, started from the MiniLM bi-encoder, as a
    assert final[:4] == ("train", "crossencoder", "--task", "faq")  # correction of the best fine-tuned one
    assert final[final.index("--init") + 1].endswith("biencoder-faq-quick")
    assert final[final.index("--negatives-encoder") + 1].endswith("biencoder-mpnet-faq-quick")
    assert final[final.index("--out") + 1].endswith("reranker-not-trained")


def test_demo_uses_the_best_summarizer_on_disk_while_a_better_one_trains(demo_env, monkeypatch):
    from medfaq.common.runtime import models_dir

    monkeypatch.delenv("MEDFAQ_DEMO_SUMMARIZER")
    monkeypatch.setenv("MEDFAQ_DEMO_NO_TRAIN", "0")
    settings = DemoSettings.from_env(everything=True)
    assert [path.name for path in settings.summarizers] == ["summarizer-gemma-quick", "summarizer-ecl-quick"]
    assert settings.summarizer.name == "summarizer-gemma-quick"  # nothing trained yet: the one to wait for
    (models_dir() / "summarizer-ecl-quick").mkdir(parents=True)
    (models_dir() / "summarizer-ecl-quick" / "config.json").write_text("{}", encoding="utf-8")
    assert settings.summarizer.name == "summarizer-ecl-quick"
    pending = [step.key for step in default_steps(settings) if step.status == "pending"]
    assert pending == ["question-writer", "summarizer-gemma"]
    (models_dir() / "summarizer-gemma-quick").mkdir()
    (models_dir() / "summarizer-gemma-quick" / "config.json").write_text("{}", encoding="utf-8")
    assert settings.summarizer.name == "summarizer-gemma-quick"
    fast = DemoSettings.from_env(fast=True)
    assert [path.name for path in fast.summarizers] == ["summarizer-ecl-quick"]


def test_setup_runner_runs_commands_and_reports_failures(demo_env):
    steps = [
        SetupStep("listing", "List datasets", (("data", "list"),)),
        SetupStep("broken", "Fetch an unknown dataset", (("data", "fetch", "no-such-dataset"),)),
    ]
    runner = SetupRunner(DemoSettings.from_env(), steps)
    runner.start()
    runner.join(timeout=120)
    listing, broken = runner.steps()
    assert (listing.status, broken.status) == ("done", "failed")
    assert "unknown dataset 'no-such-dataset'" in broken.detail
    assert "medquad" in runner.log_path(listing).read_text(encoding="utf-8")


def test_feedback_store_is_safe_with_concurrent_writers_and_survives_reopening(tmp_path):
    path = tmp_path / "feedback.sqlite3"

    def write(worker: int) -> None:
        store = FeedbackStore(path)
        for n in range(20):
            store.add(Feedback(session=f"s{worker}", question=f"q{worker}-{n}", helpful=n % 2 == 0, hit_ids=["f1"]))

    threads = [threading.Thread(target=write, args=(worker,)) for worker in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows = FeedbackStore(path).all()
    assert len(rows) == 120 and len({row.question for row in rows}) == 120
    assert sum(row.helpful for row in rows) == 60 and rows[0].hit_ids == ["f1"]


def test_results_page_plots_tables_of_results_md(tmp_path, monkeypatch):
    from medfaq.app.ui import results_page

    results = tmp_path / "results.md"
    results.write_text(
        "# Results\n\n## Search latency\n\n| stage | p50 ms | p95 ms |\n|---|---:|---:|\n"
        "| dense | 31.49 | 41.01 |\n| bm25 | 1.38 | 4.57 |\n\n## Notes\n\nNo table here.\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(results_page, "RESULTS_MD", results)
    [frame] = results_page.tables(results_page.sections(results.read_text())[0][1])
    assert frame.loc["bm25", "p95 ms"] == 4.57
    app = AppTest.from_string(
        "from medfaq.app.ui import results_page\nresults_page.render()", default_timeout=TIMEOUT_S
    )
    app.run()
    assert not app.exception
    assert [tab.label for tab in app.tabs] == ["Search latency", "Notes"]
    assert len(app.get("vega_lite_chart")) == 1


def test_medfaq_demo_serves_streamlit_on_port_8501(monkeypatch):
    from medfaq.app import cmd_demo
    from medfaq.app.cli import app as cli

    calls = []
    monkeypatch.setattr(cmd_demo, "run_until_stopped", lambda command, env: calls.append((command, env)) or 0)
    result = CliRunner().invoke(cli, ["demo", "--no-train"])
    assert result.exit_code == 0, result.output
    [(command, env)] = calls
    assert command[1:4] == ["-m", "streamlit", "run"] and command[4].endswith("app/streamlit_app.py")
    assert command[5:11] == ["--server.port", "8501", "--server.address", "localhost", "--server.headless", "true"]
    assert env["MEDFAQ_DEMO_NO_TRAIN"] == "1"


SERVER = """
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (pathlib.Path(sys.argv[1]).write_text("stopped"), sys.exit(0)))
pathlib.Path(sys.argv[2]).write_text(str(os.getpid()))
time.sleep(60)
"""
DEMO = """
import sys
from medfaq.app import cmd_demo
from medfaq.app.cli import app
cmd_demo.streamlit_command = lambda *_: [sys.executable, "-c", *sys.argv[1:]]
app(["demo"])
"""


def test_stopping_medfaq_demo_by_its_pid_stops_the_server(tmp_path):
    stopped, serving = tmp_path / "stopped", tmp_path / "serving"
    demo = subprocess.Popen([sys.executable, "-c", DEMO, SERVER, stopped, serving], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + TIMEOUT_S
    while not serving.is_file() or not serving.read_text():
        assert demo.poll() is None and time.monotonic() < deadline, "the stand-in server never started"
        time.sleep(0.05)
    try:
        demo.terminate()
        assert demo.wait(TIMEOUT_S) == 0
        assert stopped.read_text() == "stopped"  # the server was told to stop, and did, before the demo ended
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(serving.read_text()), signal.SIGKILL)


def test_adapt_page_starts_a_background_run_and_reports_it(demo_env, monkeypatch):
    from medfaq.app.ui import adapt_page, resources
    from medfaq.retriever.decisions import adaptation
    from medfaq.retriever.decisions.adaptation_config import AdaptConfig

    asked = []
    monkeypatch.setattr(adaptation, "adapt", lambda directory, config, **_: asked.append(config) or {"applied": []})
    page = AppTest.from_string("from medfaq.app.ui import adapt_page\nadapt_page.render()", default_timeout=TIMEOUT_S)
    page.run()
    assert not page.exception and "**Now:** none" in "\n".join(m.value for m in page.markdown)
    page.button(key="FormSubmitter:adapt-Adapt").click().run()
    job = adapt_page.adaptation_job(str(resources.settings().index_dir))
    assert job.wait(30)["state"] == "done" and asked == [AdaptConfig()]
    page.run()
    assert "The last run (adapt) finished" in page.success[0].value
