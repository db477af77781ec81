"""`medfaq search` (one question or a query file) and `medfaq bench`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from medfaq.app.options import INDEX, NO_STAGE_FLAGS, StageFlags, takes_stage_flags
from medfaq.app.render import hits_table
from medfaq.common.runtime import MedfaqError, local_model_dir
from medfaq.retriever.model_cache import build_pipeline, stage_models
from medfaq.retriever.pipeline_file import read_config
from medfaq.retriever.runs import (
    RUN_FORMATS,
    check_not_an_input,
    check_output,
    is_stdio,
    read_queries,
    write_run,
    write_text_atomic,
)
from medfaq.retriever.search import check_query
from medfaq.retriever.trained_models import set_up_index

if TYPE_CHECKING:
    from medfaq.retriever.pipeline import Pipeline, PipelineConfig


SEARCH_BATCH = 64  # questions per pipeline call in batch runs (the progress bar moves per batch)
LOG_UNANSWERED = typer.Option(
    False,
    "--log-unanswered",
    help="Batch: append abstained questions to the experts' queue (single questions always are).",
)


def search_config(index: Path, flags: StageFlags, **changes: Any) -> PipelineConfig:
    """The index's pipeline.json overridden by the flags and `changes` (None values ignored), built once, before the
    index and the models load; ``--abstain`` needs a threshold to abstain below."""
    config = read_config(index, flags.overrides(**changes))
    if flags.values.get("abstain") and config.active_threshold() is None:
        raise MedfaqError(
            f"--abstain needs a threshold, and {index} has none for {' nor '.join(config.threshold_keys())} (neither "
            "calibrated on it nor inherited from its encoder): pass --threshold X, or calibrate one with `medfaq eval "
            "retrieval --save-threshold`"
        )
    return config


def open_pipeline(index: Path, config: PipelineConfig, shown_entities: bool = True) -> Pipeline:
    """The index searched with `config`. Without `shown_entities` the entity recogniser (seconds to load) is left
    out unless the key-term filter or the unanswered log needs it."""
    from medfaq.index.faq_index import FaqIndex

    if not shown_entities:
        may_log = config.abstain and config.log_unanswered and config.active_threshold() is not None
        config = config.replace(entities=config.key_terms or may_log)
    return build_pipeline(FaqIndex.load(index), config)


def search_inputs(index: Path, config: PipelineConfig) -> list[Path]:
    """What a search of `index` with `config` reads or appends to: the index, its unanswered log, and the local
    directories of its encoder (the bundled MiniLM too) and of every model its stages load, the default ones
    included (an output must be none of them)."""
    from medfaq.index.storage import read_manifest
    from medfaq.retriever.queue.unanswered import UnansweredLog

    models = (read_manifest(index).encoder, *stage_models(config))
    return [index, UnansweredLog(config.unanswered_log).path, *filter(None, map(local_model_dir, models))]


def run_in_batches(pipeline: Pipeline, questions: list[str], batch_size: int = SEARCH_BATCH) -> list[Any]:
    """`pipeline.run_batch` over `questions`, `batch_size` at a time, with a progress bar on stderr."""
    from tqdm.auto import tqdm

    responses = []
    with tqdm(total=len(questions), desc="searching", unit="question", disable=len(questions) <= batch_size) as bar:
        for offset in range(0, len(questions), batch_size):
            responses += pipeline.run_batch(questions[offset : offset + batch_size])
            bar.update(min(batch_size, len(questions) - offset))
    return responses


@takes_stage_flags()
def search(
    question: str | None = typer.Argument(None, help="The question (omit with --queries)."),
    index: Path | None = INDEX,
    as_json: bool = typer.Option(False, "--json", help="Print the response as JSON."),
    queries: Path | None = typer.Option(
        None, "--queries", help='Batch: JSONL file of {"id", "question"} lines ("-": standard input).'
    ),
    output: Path | None = typer.Option(
        None, "--output", help='Batch: run file to write; one question: write what would be printed ("-": stdout).'
    ),
    format: str = typer.Option("jsonl", "--format", help=f"Batch run format: {'|'.join(RUN_FORMATS)}."),
    run_name: str = typer.Option("medfaq", "--run-name", help="Run tag in TREC files."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Batch: skip malformed lines (counted)."),
    log_unanswered: bool = LOG_UNANSWERED,
    flags: StageFlags = NO_STAGE_FLAGS,
) -> None:
    """Search an index with one question (table or --json), or a query file (--queries Q.jsonl --output RUN).

    The stages run as the index's pipeline.json says; the flags override it for this call. Abstained single
    questions go to the experts' queue ($MEDFAQ_HOME/unanswered.jsonl); batch runs only with --log-unanswered."""
    if (question is None) == (queries is None):
        raise MedfaqError("give either a question or --queries FILE (with --output RUN)")
    if queries is not None and output is None:
        raise MedfaqError("--queries needs --output RUN (the run file to write, or - for stdout)")
    if format not in RUN_FORMATS:
        raise MedfaqError(f"unknown run format {format!r}; choose one of {', '.join(RUN_FORMATS)}")
    index = index or set_up_index()
    # one question is logged when it abstains unless the index's pipeline.json says otherwise; a batch only on request
    logged = (log_unanswered or None) if question is not None else log_unanswered
    config = None
    if output is not None:  # an output inside the index or a model would destroy it: refused before any write
        config = search_config(index, flags, log_unanswered=logged)
        check_not_an_input(output, queries, *search_inputs(index, config))
        check_output(output)
    if question is not None:
        check_query(question)  # invalid text fails before anything is loaded
        from medfaq.index.encoder import answer_one_question

        answer_one_question()
        config = config or search_config(index, flags, log_unanswered=logged)
        pipeline = open_pipeline(index, config, shown_entities=as_json)
        response = pipeline.run(question)
        text = (
            json.dumps(response.to_dict(), indent=2, ensure_ascii=False)
            if as_json
            else hits_table(response, pipeline.config.log_unanswered)
        )
        if output is None or is_stdio(output):
            typer.echo(text)
        else:
            write_text_atomic(output, [text + "\n"])
            typer.echo(f"wrote the {'JSON response' if as_json else 'results table'} to {output}", err=True)
        return
    query_file = read_queries(queries, skip_bad)
    if format == "trec":
        query_file.check_trec_ids()  # before any model loads
    report = query_file.report
    if report.skipped_bad:
        typer.echo(
            f"warning: {report.skipped_bad} bad lines of {report.path} skipped (first: {report.bad_lines[:5]}); "
            f"{report.loaded} queries read",
            err=True,
        )
    pipeline = open_pipeline(index, config or search_config(index, flags, log_unanswered=logged))
    responses = run_in_batches(pipeline, query_file.questions)
    write_run(output, query_file.ids, responses, format, run_name)
    where = "stdout" if is_stdio(output) else output
    typer.echo(f"wrote {format} results for {len(responses)} queries to {where}", err=is_stdio(output))


@takes_stage_flags(without=("abstain", "threshold"))
def bench(
    index: Path | None = INDEX,
    queries: int = typer.Option(100, "--queries", min=1, help="Number of timed single-question searches."),
    as_json: bool = typer.Option(False, "--json", help="Print the measurements as JSON."),
    query_file: Path | None = typer.Option(
        None, "--query-file", help="Time these questions (JSONL, - for stdin) instead of FAQ questions of the index."
    ),
    batch_size: int = typer.Option(32, "--batch-size", min=1, help="Batch size of the throughput measurement."),
    peers: bool = typer.Option(False, "--peers/--no-peers", help="Also time rank-bm25 and util.semantic_search."),
    ann_vectors: int = typer.Option(
        0, "--ann-vectors", min=0, help="Also compare Flat/IVF/HNSW/Milvus on N synthetic vectors (1M: many minutes)."
    ),
    flags: StageFlags = NO_STAGE_FLAGS,
) -> None:
    """p50/p95 latency of the pipeline end to end and per stage, of each search mode, and batch throughput on the
    given index (seconds); --peers and --ann-vectors N add the peer comparisons. Ctrl-C prints what was measured."""
    from medfaq.eval import speed

    flags = flags.replace(abstain=False)
    index = index or set_up_index()
    texts = read_queries(query_file).questions[:queries] if query_file else None
    pipeline = open_pipeline(index, search_config(index, flags, log_unanswered=False))
    texts = texts or speed.sample_queries(pipeline.index, queries)
    run = speed.run_bench(pipeline, texts, batch_size, peers, ann_vectors)
    result = speed.bench_result(run, pipeline, index)
    typer.echo(json.dumps(result, indent=2) if as_json else speed.format_report(result))
    if run.interrupted:
        raise typer.Exit(130)
