"""`medfaq demo`: fetch MedQuAD, build the default index once, and answer a few consumer questions."""

from __future__ import annotations

from pathlib import Path

import typer

from app.render import hits_table
from index.collections import load_collection
from index.datasets import fetch_dataset
from index.encoder import Encoder
from index.faq_index import MANIFEST, FaqIndex
from index.runtime import DEFAULT_ENCODER, indexes_dir
from retriever.pipeline import Pipeline, PipelineConfig

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
DEMO_INDEX = "medquad-minilm"
EXAMPLE_QUESTIONS = (
    "can i drink alcohol while taking amoxicillin",
    "my father was just diagnosed with parkinson's, is it inherited and could I get it too?",
    "what are the early signs of type 2 diabetes",
    "how is shingles treated and is there a vaccine",
)


def demo(
    top_k: int = typer.Option(5, "--top-k", help="Results per question."),
    mode: str = typer.Option("hybrid", "--mode", help="dense|bm25|hybrid."),
) -> None:
    """Fetch MedQuAD (from ../shared/data when present), build the default index if missing, run example questions."""
    fetch_dataset("medquad", SHARED_DATA if SHARED_DATA.is_dir() else None)
    directory = indexes_dir() / DEMO_INDEX
    if not (directory / MANIFEST).is_file():
        typer.echo(f"building the MedQuAD index in {directory} (once; several minutes on a CPU)", err=True)
        records, report = load_collection("medquad")
        typer.echo(report.summary(), err=True)
        FaqIndex.build(records, Encoder(DEFAULT_ENCODER)).save(directory)
    pipeline = Pipeline(FaqIndex.load(directory), PipelineConfig(mode=mode, top_k=top_k))
    for question in EXAMPLE_QUESTIONS:
        typer.echo(hits_table(pipeline.run(question)) + "\n")
