"""`medfaq search` (one question or a query file) and `medfaq bench`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from app.render import hits_table
from index.faq_index import FaqIndex
from index.runtime import MedfaqError
from retriever.pipeline import Pipeline, PipelineConfig
from retriever.runs import RUN_FORMATS, read_queries, write_run
from retriever.search import MODES


def search(
    question: str | None = typer.Argument(None, help="The question (omit with --queries)."),
    index: Path = typer.Option(..., "--index", help="Index directory."),
    top_k: int = typer.Option(10, "--top-k", help="Number of results."),
    mode: str = typer.Option("hybrid", "--mode", help=f"Retrieval mode: {'|'.join(MODES)}."),
    as_json: bool = typer.Option(False, "--json", help="Print the response as JSON."),
    queries: Path | None = typer.Option(None, "--queries", help='Batch: JSONL file of {"id", "question"} lines.'),
    output: Path | None = typer.Option(None, "--output", help="Batch: run file to write."),
    format: str = typer.Option("jsonl", "--format", help=f"Batch run format: {'|'.join(RUN_FORMATS)}."),
    run_name: str = typer.Option("medfaq", "--run-name", help="Run tag in TREC files."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Batch: skip malformed lines (counted)."),
) -> None:
    """Search an index with one question (table or --json), or a query file (--queries Q.jsonl --output RUN)."""
    if (question is None) == (queries is None):
        raise MedfaqError("give either a question or --queries FILE (with --output RUN)")
    if queries is not None and output is None:
        raise MedfaqError("--queries needs --output RUN (the run file to write)")
    if format not in RUN_FORMATS:
        raise MedfaqError(f"unknown run format {format!r}; choose one of {', '.join(RUN_FORMATS)}")
    config = PipelineConfig.load(index) if index.is_dir() else PipelineConfig()
    config = PipelineConfig.from_dict({**config.to_dict(), "mode": mode, "top_k": top_k})
    pipeline = Pipeline.from_config(FaqIndex.load(index), config)
    if question is not None:
        response = pipeline.run(question)
        typer.echo(json.dumps(response.to_dict(), indent=2, ensure_ascii=False) if as_json else hits_table(response))
        return
    query_file = read_queries(queries, skip_bad)
    if query_file.report.skipped_bad:
        typer.echo(query_file.report.summary(), err=True)
    responses = pipeline.run_batch(query_file.questions)
    hits = [response.hits for response in responses]
    write_run(output, query_file.ids, [r.query for r in responses], hits, format, run_name)
    typer.echo(f"wrote {format} results for {len(hits)} queries to {output}")


def bench(
    index: Path = typer.Option(..., "--index", help="Index directory."),
    queries: int = typer.Option(100, "--queries", help="Number of timed single-query searches per stage."),
    top_k: int = typer.Option(10, "--top-k", help="Results per search."),
    as_json: bool = typer.Option(False, "--json", help="Print the measurements as JSON."),
) -> None:
    """Measure p50/p95 latency of single-query dense, BM25 and hybrid search."""
    from eval.speed import benchmark, format_table, sample_queries

    faq_index = FaqIndex.load(index)
    stats = benchmark(faq_index, sample_queries(faq_index, queries), top_k=top_k)
    typer.echo(json.dumps([s.to_dict() for s in stats], indent=2) if as_json else format_table(stats))
