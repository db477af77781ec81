"""`medfaq demo`: serve the Streamlit demo on localhost:8501 (set-up progress on the page), or `--cli` for a table."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import typer

from medfaq.app.options import NO_STAGE_FLAGS, StageFlags, port_option, takes_stage_flags
from medfaq.app.setup_state import ENV_NO_TRAIN, EXAMPLE_QUESTIONS, SHARED_DATA, DemoSettings
from medfaq.retriever.decisions.encoder_rule import stock_encoder
from medfaq.retriever.trained_models import index_built

APP_SCRIPT = Path(__file__).resolve().parent / "streamlit_app.py"
THEME = {"primaryColor": "#0f766e", "backgroundColor": "#ffffff", "secondaryBackgroundColor": "#f1f5f9"}
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # passed on to the Streamlit server
STOP_WAIT_S = 10  # how long a server told to stop may take before it is killed


def streamlit_command(port: int = 8501, address: str = "localhost", script: Path = APP_SCRIPT) -> list[str]:
    """The command that serves the demo (headless: no browser is opened, no usage statistics are sent)."""
    theme = [f"--theme.{name}={value}" for name, value in THEME.items()]
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(script),
        "--server.port",
        str(port),
        "--server.address",
        address,
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "viewer",
        *theme,
    ]


DEMO_TOP_K = 5  # results per example question (--cli), unless --top-k says otherwise


@takes_stage_flags(only=("mode", "top_k"))
def demo(
    cli: bool = typer.Option(False, "--cli", help="Print the example questions' results instead of serving the page."),
    no_train: bool = typer.Option(False, "--no-train", help="Do not train missing models; run without them."),
    port: int = port_option(8501, "Port of the web page."),
    address: str = typer.Option("localhost", "--address", help="Address to serve on (0.0.0.0 for all interfaces)."),
    flags: StageFlags = NO_STAGE_FLAGS,
) -> None:
    """Serve the demo at http://localhost:8501; on first run the page runs `medfaq setup` (fetches MedQuAD, builds
    the index, trains the quick summarizers and reranker; or, with --no-train, runs without them), using the best
    summarizer on disk while a better one trains. --mode and --top-k are for --cli (default: the index's
    pipeline.json, 5 results)."""
    DemoSettings.from_env()  # a wrong MEDFAQ_DEMO_* setting fails here, in one line, before anything starts
    if cli:
        answer_examples(flags)
        return
    env = {**os.environ, **({ENV_NO_TRAIN: "1"} if no_train else {})}
    typer.echo(f"medfaq demo: open http://{address}:{port} (Ctrl-C stops it)", err=True)
    code = run_until_stopped(streamlit_command(port, address), env)
    if code != 0:
        raise typer.Exit(code)


def run_until_stopped(command: list[str], env: dict[str, str]) -> int:
    """Run `command` and return its exit status (128 + N when signal N ended it). SIGTERM and SIGHUP sent to this
    process are passed on to it, and it is stopped when this process stops for another reason (Ctrl-C), so that
    stopping the demo by its PID never leaves the server running."""
    child = subprocess.Popen(command, env=env)
    previous = {number: signal.signal(number, lambda number, _: child.send_signal(number)) for number in STOP_SIGNALS}
    try:
        code = child.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    return 128 - code if code < 0 else code


def answer_examples(flags: StageFlags) -> None:
    """Fetch MedQuAD (from ../shared/data when present), build the default index if missing, run example questions."""
    from medfaq.app.cmd_index import inherit_threshold
    from medfaq.app.render import hits_table
    from medfaq.index.collections import load_collection
    from medfaq.index.datasets import fetch_dataset
    from medfaq.index.encoder import load_encoder
    from medfaq.index.faq_index import FaqIndex
    from medfaq.retriever.model_cache import build_pipeline
    from medfaq.retriever.pipeline_file import read_config

    fetch_dataset("medquad", SHARED_DATA if SHARED_DATA.is_dir() else None)
    directory = DemoSettings.from_env().index_dir  # the fine-tuned encoder's index once `medfaq setup` built it
    if not index_built(directory):
        typer.echo(f"building the MedQuAD index in {directory} (once; several minutes on a CPU)", err=True)
        records, report = load_collection("medquad")
        typer.echo(report.summary(), err=True)
        encoder = stock_encoder(first_run=True)
        FaqIndex.build(records, load_encoder(encoder)).save(directory)
        inherit_threshold(directory, encoder)  # the stock encoder's shipped threshold, as `index build` gives
    stages_off = {"summarize": False, "rerank": False, "entities": False}  # the table shows the hits alone
    # Canned examples are not consumers' questions: none goes to the experts' queue (as on the web page).
    config = flags.apply(read_config(directory).updated(top_k=DEMO_TOP_K, log_unanswered=False), **stages_off)
    pipeline = build_pipeline(FaqIndex.load(directory), config)
    for question in EXAMPLE_QUESTIONS:
        typer.echo(hits_table(pipeline.run(question), logged=False) + "\n")
