"""`medfaq data make-benchmark` and `medfaq eval retrieval`: BEIR benchmarks and retrieval evaluation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from medfaq.app.cmd_index import ENCODER_OPTION, SYNONYMS_OPTION, inherit_threshold, open_encoder
from medfaq.app.cmd_search import (
    ABSTAIN,
    BEAMS,
    ENCODER_BACKEND,
    QUANTIZE,
    QUERY,
    RERANK,
    RERANK_DEPTH,
    RERANK_FUSION,
    RERANK_MARGIN,
    RERANK_MAX_LENGTH,
    RERANK_PRECISION,
    RERANKER,
    SUMMARIZE,
    SUMMARIZER,
    THRESHOLD,
    StageFlags,
)
from medfaq.common.runtime import MedfaqError, indexes_dir
from medfaq.retriever.pipeline import Pipeline, PipelineConfig, load_stage, store_threshold
from medfaq.retriever.runs import check_not_an_input, check_output, write_run
from medfaq.retriever.search import MODES


def make_benchmark(
    name: str = typer.Argument(..., help="meqsum | mediqa2021 | rqe-valid | rqe-test | quebec | medquad-chq"),
    out: Path = typer.Option(..., "--out", help="Directory for corpus.jsonl, queries.jsonl, qrels.tsv, ..."),
    data_from: Path | None = typer.Option(
        None, "--from", help="Read the datasets from DIR (the shared/data layout) instead of `medfaq data fetch`."
    ),
    build_index: bool = typer.Option(True, "--index/--no-index", help="Also index the corpus into OUT/index."),
    encoder: str = ENCODER_OPTION,
    bank: Path | None = typer.Option(
        None, "--bank", help="medquad-chq: the MedQuAD index to add the gold FAQs to (default: indexes/medquad-minilm)."
    ),
    synonyms: str = SYNONYMS_OPTION,
) -> None:
    """Write a retrieval benchmark in the BEIR layout (plus TREC qrels, ood.txt, dev.txt) and index its corpus."""
    from medfaq.eval.benchmarks import BANK_INDEX, CORPUS_FIELDS, index_over_bank
    from medfaq.eval.benchmarks import make_benchmark as build
    from medfaq.index.collections import load_collection, read_records
    from medfaq.index.concepts import concept_lexicon
    from medfaq.index.faq_index import MANIFEST, RECORDS, FaqIndex, check_index_target

    if build_index:
        check_index_target(out / "index")
    concepts = concept_lexicon(synonyms) if build_index and name != "medquad-chq" else None
    bank = bank or indexes_dir() / BANK_INDEX
    if name == "medquad-chq" and not (bank / MANIFEST).is_file():
        raise MedfaqError(f"no MedQuAD index at {bank}; build it with `medfaq index build medquad --out {bank}`")
    benchmark = build(name, data_from, read_records(bank / RECORDS) if name == "medquad-chq" else None)
    benchmark.save(out)
    counts = ", ".join(f"{value} {key.replace('_', ' ')}" for key, value in benchmark.counts().items())
    typer.echo(f"{name}: {counts} -> {out}")
    if build_index and name == "medquad-chq":
        encoded = index_over_bank(benchmark, out / "index", bank)
        typer.echo(f"copied the index {bank} and added {encoded} FAQs into {out / 'index'}")
    elif build_index:
        records, _ = load_collection(out / "corpus.jsonl", "jsonl", CORPUS_FIELDS)
        sentence_encoder = open_encoder(encoder)
        FaqIndex.build(records, sentence_encoder, concepts=concepts).save(out / "index")
        inherit_threshold(out / "index", sentence_encoder.name)
        typer.echo(f"indexed {len(records)} FAQs into {out / 'index'}")


def eval_retrieval(
    index: Path = typer.Option(..., "--index", help="Index directory (of the benchmark's corpus)."),
    queries: Path = typer.Option(..., "--queries", help="queries.jsonl (BEIR, or medfaq id/question lines)."),
    qrels: Path = typer.Option(..., "--qrels", help="qrels.tsv (BEIR) or TREC qrels."),
    compare: bool = typer.Option(False, "--compare", help="Evaluate BM25/dense/hybrid/rerank/summary variants."),
    systems: str | None = typer.Option(
        None, "--systems", help="With --compare: only these, comma-separated (e.g. bm25,summary-hybrid+rerank)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the metrics as JSON."),
    run_out: Path | None = typer.Option(None, "--run-out", help="Write the run as a TREC file (not with --compare)."),
    mode: str | None = typer.Option(None, "--mode", help=f"Retrieval mode: {'|'.join(MODES)}."),
    save_threshold: bool = typer.Option(
        False,
        "--save-threshold",
        help="Store this configuration's dev-calibrated threshold in the index's pipeline.json.",
    ),
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
    rerank_depth: int | None = RERANK_DEPTH,
    rerank_margin: float | None = RERANK_MARGIN,
    rerank_max_length: int | None = RERANK_MAX_LENGTH,
    rerank_precision: str | None = RERANK_PRECISION,
    encoder_backend: str | None = ENCODER_BACKEND,
    min_words: int = typer.Option(0, "--min-words", min=0, help="Evaluate only the questions of at least N words."),
    summaries: Path | None = typer.Option(
        None, "--summaries", help="With --compare: JSONL of questions and their 'summary' (`medfaq summarize --input`)."
    ),
) -> None:
    """Recall@1/5/10, MRR@10, nDCG@10, P@5 on the judged test queries; with out-of-scope queries also abstention
    AUROC and accuracy at the threshold calibrated on the dev queries. `--compare` puts the variants side by side."""
    import medfaq.retriever.stages  # noqa: F401  (registers the summarizer, reranker and NER stage loaders)
    from medfaq.eval.benchmarks import read_beir_queries, read_qrels
    from medfaq.eval.retrieval import RetrievalEvaluator, compare_variants, format_table, run_pipeline
    from medfaq.index.faq_index import FaqIndex

    if compare and (run_out is not None or save_threshold):
        raise MedfaqError("--run-out and --save-threshold evaluate one configuration; leave out --compare")
    if summaries is not None and not compare:
        raise MedfaqError("--summaries is for --compare")
    known = read_summaries(summaries) if summaries is not None else None
    if run_out is not None:
        check_output(run_out)
        check_not_an_input(run_out, queries, qrels, summaries, option="--run-out")
    rows = read_beir_queries(queries)
    judgements = read_qrels(qrels)
    texts = {row["_id"]: row["text"] for row in rows}
    unknown = sorted(set(judgements) - set(texts))
    if unknown:
        raise MedfaqError(f"{qrels}: {len(unknown)} judged query ids are not in {queries} (e.g. {unknown[0]!r})")
    if min_words:
        rows = [row for row in rows if len(row["text"].split()) >= min_words]
        texts = {row["_id"]: row["text"] for row in rows}
        judgements = {qid: docs for qid, docs in judgements.items() if qid in texts}
        if not judgements:
            raise MedfaqError(f"no judged question has {min_words} words or more")
    evaluator = RetrievalEvaluator(
        judgements,
        ood_ids={r["_id"] for r in rows if r["metadata"].get("ood")},
        dev_ids={r["_id"] for r in rows if r["metadata"].get("split") == "dev"},
    )
    flags = StageFlags.from_options(locals())
    config = flags.apply(PipelineConfig.load(index), mode=mode, top_k=10)
    faq_index = FaqIndex.load(index)
    result: dict[str, Any] = {"queries": len(texts), "judged_test": len(evaluator.test_qrels())}
    if compare:
        config = config.updated(entities=False)
        stages, missing = _optional_stages(config)
        wanted = [name.strip() for name in systems.split(",")] if systems else None
        table, skipped = compare_variants(
            faq_index, texts, evaluator, config, **stages, progress=not as_json, systems=wanted, summaries=known
        )
        result |= {"rows": [{"system": n, **m} for n, m in table], "skipped": skipped, "missing_stages": missing}
    else:
        config = config.updated(entities=config.key_terms, abstain=False, log_unanswered=False)
        pipeline = Pipeline.from_config(faq_index, config)
        run, confidences, responses = run_pipeline(pipeline, texts, progress=not as_json)
        table = [(_describe(config), evaluator(run, confidences))]
        result |= {"rows": [{"system": table[0][0], **table[0][1]}], "config": config.to_dict()}
        if run_out is not None:
            write_run(run_out, list(texts), responses, "trec", "medfaq")
        if save_threshold:
            if "threshold" not in table[0][1]:
                raise MedfaqError("--save-threshold needs out-of-scope and dev queries to calibrate on")
            result["saved"] = str(store_threshold(index, config, table[0][1]["threshold"]))
            result["threshold_key"] = config.threshold_key
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    typer.echo(format_table(table))
    if result.get("skipped"):
        typer.echo(f"skipped (stage missing): {', '.join(result['skipped'])}")
        for reason in result["missing_stages"]:
            typer.echo(f"  {reason}")
    if "saved" in result:
        typer.echo(f"threshold {table[0][1]['threshold']:.4f} of {result['threshold_key']} saved to {result['saved']}")


def read_summaries(path: Path) -> dict[str, str]:
    """question -> summary from a JSONL file of `medfaq summarize --input ... --output` rows (``summary``, or the
    ``prediction`` of `medfaq eval summarizer --output`)."""
    from medfaq.app.cmd_summarize import read_texts

    rows, texts = read_texts(path)
    known = {}
    for number, (row, text) in enumerate(zip(rows, texts, strict=True), 1):
        summary = row.get("summary", row.get("prediction"))
        if not isinstance(summary, str):
            raise MedfaqError(f"{path}: row {number} has no 'summary' text")
        known[text.strip()] = summary  # the pipeline strips questions before summarizing them
    return known


def _optional_stages(config: PipelineConfig) -> tuple[dict[str, Any], list[str]]:
    """The summarizer and reranker for a comparison, each None (with the reason) when it cannot be loaded."""
    stages: dict[str, Any] = {}
    missing: list[str] = []
    for key, kind, name in (("rewriter", "rewrite", config.summarizer), ("reranker", "rerank", config.reranker)):
        try:
            stages[key] = load_stage(kind, name, config)
        except MedfaqError as error:
            stages[key] = None
            missing.append(f"{kind}: {error}")
    return stages, missing


def _describe(config: PipelineConfig) -> str:
    parts = [config.mode if config.query_source == "raw" else f"{config.mode} on {config.query_source}"]
    parts += ["rerank"] * config.rerank
    return " + ".join(parts)


def register(app: typer.Typer, *, data_app: typer.Typer, train_app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add this module's commands to the `medfaq` command groups."""
    data_app.command("make-benchmark")(make_benchmark)
    eval_app.command("retrieval")(eval_retrieval)
