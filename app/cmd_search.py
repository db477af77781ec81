"""`medfaq search` (one question or a query file) and `medfaq bench`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

import retriever.stages  # noqa: F401  (registers the summarizer, reranker and NER stage loaders)
from app.render import hits_table
from index.faq_index import FaqIndex
from index.runtime import MedfaqError
from retriever.pipeline import QUERY_SOURCES, Pipeline, PipelineConfig
from retriever.runs import RUN_FORMATS, read_queries, write_run
from retriever.search import MODES


@dataclass
class StageFlags:
    """The pipeline flags `search`, `bench` and `eval retrieval` share; None = keep the index's pipeline.json."""

    summarize: bool | None = None
    query: str | None = None
    rerank: bool | None = None
    abstain: bool | None = None
    summarizer: str | None = None
    reranker: str | None = None
    threshold: float | None = None
    beams: int | None = None
    quantize: bool | None = None
    rerank_fusion: str | None = None

    def apply(self, config: PipelineConfig, **changes: Any) -> PipelineConfig:
        if self.query is not None and self.query not in QUERY_SOURCES:
            raise MedfaqError(f"unknown --query {self.query!r}; choose one of {', '.join(QUERY_SOURCES)}")
        return config.with_flags(
            summarize=self.summarize,
            query_source=self.query,
            rerank=self.rerank,
            abstain=self.abstain,
            summarizer=self.summarizer,
            reranker=self.reranker,
            threshold=self.threshold,
            summary_beams=self.beams,
            quantize=self.quantize,
            rerank_fusion=self.rerank_fusion,
            **changes,
        )


SUMMARIZE = typer.Option(
    None, "--summarize/--no-summarize", help="Summarize the question first (default: the index's pipeline.json)."
)
QUERY = typer.Option(
    None, "--query", help=f"Search with the {'|'.join(QUERY_SOURCES)} question (summary/both imply --summarize)."
)
RERANK = typer.Option(None, "--rerank/--no-rerank", help="Rerank the top hits with a cross-encoder.")
ABSTAIN = typer.Option(None, "--abstain/--no-abstain", help="Abstain (and log the question) below the threshold.")
SUMMARIZER = typer.Option(None, "--summarizer", help="Summarizer model (directory or name under $MEDFAQ_HOME/models).")
RERANKER = typer.Option(None, "--reranker", help="Cross-encoder model (directory or name under $MEDFAQ_HOME/models).")
THRESHOLD = typer.Option(None, "--threshold", help="Abstain when the confidence is below this.")
BEAMS = typer.Option(None, "--beams", help="Summarizer beams (1 = greedy).")
QUANTIZE = typer.Option(None, "--quantize/--no-quantize", help="int8 dynamic quantisation of summarizer and reranker.")
RERANK_FUSION = typer.Option(
    None, "--rerank-fusion", help="replace: order by the cross-encoder; rrf: RRF of retrieval and cross-encoder ranks."
)


def open_pipeline(index: Path, flags: StageFlags, **changes: Any) -> Pipeline:
    """The index with its pipeline.json, overridden by the flags and `changes` (None values ignored)."""
    faq_index = FaqIndex.load(index)
    return Pipeline.from_config(faq_index, flags.apply(PipelineConfig.load(index), **changes))


def search(
    question: str | None = typer.Argument(None, help="The question (omit with --queries)."),
    index: Path = typer.Option(..., "--index", help="Index directory."),
    top_k: int | None = typer.Option(None, "--top-k", help="Number of results (default 10)."),
    mode: str | None = typer.Option(None, "--mode", help=f"Retrieval mode: {'|'.join(MODES)} (default hybrid)."),
    as_json: bool = typer.Option(False, "--json", help="Print the response as JSON."),
    queries: Path | None = typer.Option(None, "--queries", help='Batch: JSONL file of {"id", "question"} lines.'),
    output: Path | None = typer.Option(None, "--output", help="Batch: run file to write."),
    format: str = typer.Option("jsonl", "--format", help=f"Batch run format: {'|'.join(RUN_FORMATS)}."),
    run_name: str = typer.Option("medfaq", "--run-name", help="Run tag in TREC files."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Batch: skip malformed lines (counted)."),
    summarize: bool | None = SUMMARIZE,
    query: str | None = QUERY,
    rerank: bool | None = RERANK,
    abstain: bool | None = ABSTAIN,
    summarizer: str | None = SUMMARIZER,
    reranker: str | None = RERANKER,
    threshold: float | None = THRESHOLD,
    beams: int | None = BEAMS,
    quantize: bool | None = QUANTIZE,
    rerank_fusion: str | None = RERANK_FUSION,
) -> None:
    """Search an index with one question (table or --json), or a query file (--queries Q.jsonl --output RUN).

    The stages run as the index's pipeline.json says; the flags override it for this call."""
    if (question is None) == (queries is None):
        raise MedfaqError("give either a question or --queries FILE (with --output RUN)")
    if queries is not None and output is None:
        raise MedfaqError("--queries needs --output RUN (the run file to write)")
    if format not in RUN_FORMATS:
        raise MedfaqError(f"unknown run format {format!r}; choose one of {', '.join(RUN_FORMATS)}")
    flags = StageFlags(
        summarize, query, rerank, abstain, summarizer, reranker, threshold, beams, quantize, rerank_fusion
    )
    pipeline = open_pipeline(index, flags, mode=mode, top_k=top_k)
    if question is not None:
        response = pipeline.run(question)
        typer.echo(json.dumps(response.to_dict(), indent=2, ensure_ascii=False) if as_json else hits_table(response))
        return
    query_file = read_queries(queries, skip_bad)
    if query_file.report.skipped_bad:
        typer.echo(query_file.report.summary(), err=True)
    responses = pipeline.run_batch(query_file.questions)
    write_run(output, query_file.ids, responses, format, run_name)
    typer.echo(f"wrote {format} results for {len(responses)} queries to {output}")


def bench(
    index: Path = typer.Option(..., "--index", help="Index directory."),
    queries: int = typer.Option(100, "--queries", help="Number of timed single-query searches per stage."),
    top_k: int = typer.Option(10, "--top-k", help="Results per search."),
    as_json: bool = typer.Option(False, "--json", help="Print the measurements as JSON."),
    query_file: Path | None = typer.Option(
        None, "--query-file", help="Time these questions (JSONL) instead of lower-cased FAQ questions of the index."
    ),
    batch_size: int = typer.Option(32, "--batch-size", help="Batch size of the throughput measurement."),
    peers: bool = typer.Option(True, "--peers/--no-peers", help="Also time rank-bm25 and util.semantic_search."),
    ann_vectors: int = typer.Option(
        1_000_000, "--ann-vectors", help="Synthetic vectors for the Flat/IVF/HNSW comparison (0 skips it)."
    ),
    summarize: bool | None = SUMMARIZE,
    query: str | None = QUERY,
    rerank: bool | None = RERANK,
    summarizer: str | None = SUMMARIZER,
    reranker: str | None = RERANKER,
    beams: int | None = BEAMS,
    quantize: bool | None = QUANTIZE,
    rerank_fusion: str | None = RERANK_FUSION,
) -> None:
    """p50/p95 latency per search mode, per pipeline stage and end to end; batch throughput, peak memory, index
    size; peers as ratios (rank-bm25 vs bm25s, util.semantic_search vs FAISS, Flat vs IVF vs HNSW)."""
    from eval import speed

    if queries < 1:
        raise MedfaqError("--queries must be at least 1")
    flags = StageFlags(summarize, query, rerank, False, summarizer, reranker, None, beams, quantize, rerank_fusion)
    pipeline = open_pipeline(index, flags, top_k=top_k, log_unanswered=False)
    faq_index = pipeline.index
    texts = read_queries(query_file).questions[:queries] if query_file else speed.sample_queries(faq_index, queries)
    modes = speed.benchmark(faq_index, texts, top_k=top_k)
    result: dict[str, Any] = {
        "queries": len(texts),
        "config": pipeline.config.to_dict(),
        **speed.pipeline_latency(pipeline, texts),
        "modes": [s.to_dict() for s in modes],
        "throughput": speed.batch_throughput(pipeline, texts, batch_size),
        "index_size_mb": speed.directory_size_mb(str(index)),
    }
    if peers:
        peer_texts = texts[:20]
        result["peers"] = {
            "bm25": speed.bm25_peers(faq_index, peer_texts, top_k),
            "dense": speed.dense_peers(faq_index, peer_texts, top_k),
            "ann": speed.ann_peers(ann_vectors),
        }
    result["peak_memory_mb"] = speed.peak_memory_mb()
    typer.echo(json.dumps(result, indent=2) if as_json else speed.format_report(result, modes))
