"""End to end in a real browser: serve the demo on a tiny index with stand-in models, ask, read, give feedback.

Uses Debian's chromium (`apt-get install chromium`; `.ci/run` installs it) driven by Playwright; no browser is
downloaded. Skipped only when /usr/bin/chromium is absent.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from medfaq.app.cmd_demo import streamlit_command

CHROMIUM = Path(os.environ.get("MEDFAQ_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TESTS_DIR = Path(__file__).resolve().parent
QUESTION = "I started amoxicillin on Monday for a chest infection. Can I drink alcohol while taking amoxicillin?"
START_TIMEOUT_S = 60
ENTRY = f"""
import sys
sys.path.insert(0, {str(TESTS_DIR)!r})
import demo_fakes
from medfaq.app.streamlit_app import main

demo_fakes.install()
main()
"""

pytestmark = pytest.mark.skipif(not CHROMIUM.is_file(), reason=f"no chromium at {CHROMIUM} (apt-get install chromium)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_serving(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"streamlit exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"streamlit did not answer on {url} within {START_TIMEOUT_S} s")


def wait_until_idle(page) -> None:
    """Until the app's script has finished running."""
    page.wait_for_selector("[data-testid=stStatusWidgetRunningIcon]", state="detached", timeout=60_000)


def open_expander(page, header: str, inside) -> None:
    """Make `inside` visible, opening the expander titled `header` when a rerun of the page has closed it (Streamlit
    may make an expander anew, closed, when the elements around it change)."""
    from playwright.sync_api import expect

    wait_until_idle(page)
    if not inside.is_visible():
        page.get_by_text(header).click()
    expect(inside).to_be_visible(timeout=15_000)


def save_screenshot(page, path: Path) -> None:
    """The whole page once the script has finished: Streamlit scrolls inside its main block, so the window is
    first made as tall as it."""
    wait_until_idle(page)
    height = page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": page.viewport_size["width"], "height": max(600, height)})
    page.wait_for_timeout(500)
    page.screenshot(path=str(path))


@pytest.fixture
def served_demo(tmp_path, tiny_encoder):
    """The demo served by streamlit on a free port over a tiny index; yields (url, environment)."""
    from demo_fakes import build_demo_home

    env = {**os.environ, **build_demo_home(tmp_path / "home", tiny_encoder), "OMP_NUM_THREADS": "1"}
    entry = tmp_path / "entry.py"
    entry.write_text(ENTRY, encoding="utf-8")
    port = free_port()
    log = (tmp_path / "streamlit.log").open("w")
    server = subprocess.Popen(
        streamlit_command(port, "127.0.0.1", entry), env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, server)
        yield url, env
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a server still busy with a slow request
            server.kill()
            server.wait()
        log.close()


def test_ask_read_results_and_give_feedback(served_demo, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    from medfaq.retriever.queue.feedback import FeedbackStore

    url, env = served_demo
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.goto(url)
        box = page.get_by_label("Your question")
        expect(box).to_be_visible(timeout=START_TIMEOUT_S * 1000)
        box.fill(QUESTION)
        page.get_by_role("button", name="Search", exact=True).click()
        # the first search loads the index and the models: on a loaded machine that takes as long as starting up
        expect(page.get_by_text("We read your question as")).to_be_visible(timeout=START_TIMEOUT_S * 1000)
        expect(page.locator(".mf-summary mark.mf-drug").first).to_have_text(re.compile("amoxicillin|alcohol"))
        cards = page.locator(".mf-question")
        expect(cards.first).to_contain_text("Can I drink alcohol while taking amoxicillin?")
        expect(cards).to_have_count(5)
        page.get_by_role("button", name=re.compile("Yes")).click()
        expect(page.get_by_text("Thanks — your feedback was saved.")).to_be_visible(timeout=15_000)
        save_screenshot(page, tmp_path / "search.png")
        browser.close()

    rows = FeedbackStore(Path(env["MEDFAQ_HOME"]) / "demo" / "feedback.sqlite3").all()
    assert [(row.question, row.helpful, row.hit_ids[0]) for row in rows] == [(QUESTION, True, "f1")]
    assert (tmp_path / "search.png").stat().st_size > 10_000


def test_an_expert_answers_a_queued_question_and_the_search_then_finds_it(served_demo, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    asked = "Xylophone lessons near Zanzibar?"
    url, _ = served_demo
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})

        def search() -> None:
            page.goto(url)
            box = page.get_by_label("Your question")
            expect(box).to_be_visible(timeout=START_TIMEOUT_S * 1000)
            box.fill(asked)
            page.get_by_role("button", name="Search", exact=True).click()

        search()
        expect(page.get_by_text("No good match")).to_be_visible(timeout=START_TIMEOUT_S * 1000)
        page.goto(f"{url}/expert-queue")
        header = f"{asked} — asked 1×"
        expect(page.get_by_text(header)).to_be_visible(timeout=START_TIMEOUT_S * 1000)
        title = page.get_by_label("FAQ question")
        expect(title).to_have_value(asked)  # the summarizer's title to start from
        open_expander(page, header, title)
        title.fill("Where can I take xylophone lessons in Zanzibar?")
        page.get_by_role("textbox", name="Answer").fill("At the Zanzibar music school.")
        page.get_by_role("button", name="Add this FAQ").click()
        expect(page.get_by_text("Added a new FAQ")).to_be_visible(timeout=30_000)
        save_screenshot(page, tmp_path / "queue.png")
        search()
        cards = page.locator(".mf-question")
        expect(cards.first).to_contain_text("Where can I take xylophone lessons in Zanzibar?", timeout=30_000)
        expect(page.get_by_text("No good match")).to_have_count(0)
        browser.close()
