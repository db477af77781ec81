"""`medfaq eval summarizer|duplicates|retrieval`: the summarizer, the duplicate detector and retrieval."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import typer

from medfaq.app.cmd_search import search_inputs
from medfaq.app.cmd_train import resolve_training_models, training_models
from medfaq.app.options import (
    DEVICE,
    GUIDANCE,
    LENGTH_PENALTY,
    MBR,
    NO_OVERRIDES,
    NO_STAGE_FLAGS,
    StageFlags,
    finite,
    takes_stage_flags,
    takes_training_overrides,
)
from medfaq.common.runtime import MedfaqError, check_out_dir, local_model_dir, resolve_model
from medfaq.retriever.model_cache import build_pipeline, shared_cache
from medfaq.retriever.pipeline import PipelineConfig
from medfaq.retriever.pipeline_file import read_config, store_threshold
from medfaq.retriever.runs import check_not_an_input, check_output, write_run


def eval_summarizer(
    model: str = typer.Option(..., "--model", help="Trained summarizer directory, model name or HF id."),
    data: str = typer.Option("meqsum:test", "--data", help="<dataset>:<split>, e.g. meqsum:test."),
    as_json: bool = typer.Option(False, "--json", help="Print only one JSON object of the metrics on stdout."),
    output: Path | None = typer.Option(
        None, "--output", help="Predictions JSONL (default predictions_<data>.jsonl; - = stdout, metrics on stderr)."
    ),
    num_beams: int = typer.Option(3, "--num-beams", min=1, help="Beam size (1: greedy)."),
    max_length: int = typer.Option(64, "--max-length", min=1, help="Maximum generated tokens."),
    batch_size: int = typer.Option(16, "--batch-size", min=1, help="Generation batch size."),
    mbr: int = MBR,
    guidance: float = GUIDANCE,
    length_penalty: float = LENGTH_PENALTY,
    data_root: Path | None = typer.Option(None, "--data-root", help="Read data laid out like ../shared/data."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Evaluate the first N pairs only."),
    ner: str = typer.Option("auto", "--ner", help="Entity recogniser for FIR/consistency: auto|dictionary|stanza."),
    device: str | None = DEVICE,
    quantize: bool = typer.Option(False, "--quantize", help="int8 dynamic quantisation of the summarizer (CPU)."),
    int8_backend: str = typer.Option(
        "auto", "--int8-backend", help="With --quantize: auto, ctranslate2 (decoder-only models) or torch."
    ),
) -> None:
    """Generate summaries for a summarization split and report ROUGE-1/2/L, FIR and entity consistency (percent)."""
    from medfaq.eval.summarization import SummarizationEvaluator
    from medfaq.eval.summarization_data import load_pairs
    from medfaq.retriever.runs import check_output, is_stdio, write_text_atomic
    from medfaq.summarizer.decoding import Decoding
    from medfaq.summarizer.entities import load_recognizer
    from medfaq.summarizer.generation import consensus

    output = output or Path(f"predictions_{re.sub(r'[^A-Za-z0-9_.-]+', '_', data)}.jsonl")
    check_not_an_input(output, local_model_dir(model), data_root)
    check_output(output)
    pairs = load_pairs(data, data_root)[:limit]
    if not pairs:
        raise MedfaqError(f"{data} has no pairs")
    if guidance and quantize:
        raise MedfaqError("--guidance runs on the fp32 model; drop --quantize")
    decoding = Decoding(num_beams, max_length, length_penalty, guidance, mbr)
    resolve_model(model)  # a missing model fails here, before anything is loaded
    summarizer = _summarizer_class().load(model, device=device, quantize=quantize, int8_backend=int8_backend)
    evaluator = SummarizationEvaluator.from_pairs(
        pairs, recognizer=load_recognizer(ner), name=f"{model} on {data}", stream=sys.stderr if as_json else None
    )
    start = time.perf_counter()
    texts = [pair.chq for pair in pairs]
    found = summarizer.candidates(texts, decoding, batch_size)
    predictions = [consensus(beams) for beams in found]
    seconds = time.perf_counter() - start
    rows = [
        json.dumps(
            {"id": p.id, "chq": p.chq, "reference": p.faq, "prediction": prediction}
            | ({"candidates": beams} if mbr > 1 else {}),
            ensure_ascii=False,
        )
        + "\n"
        for p, prediction, beams in zip(pairs, predictions, found, strict=True)
    ]
    to_stdout = is_stdio(output)
    if to_stdout:
        sys.stdout.writelines(rows)
    else:
        write_text_atomic(output, rows)
    metrics = evaluator(predictions)
    metrics |= {"seconds": seconds, "questions_per_s": len(pairs) / seconds if seconds else 0.0}
    where = "stdout" if to_stdout else str(output)
    if as_json:
        settings = {"model": model, "data": data, "decoding": asdict(decoding), "predictions": where}
        typer.echo(json.dumps(metrics | settings), err=to_stdout)
    else:
        typer.echo(f"{metrics['questions_per_s']:.1f} questions/s; predictions in {where}", err=to_stdout)


def _summarizer_class():
    """`summarizer.generation.Summarizer` (imported late: loading torch and transformers takes seconds)."""
    from medfaq.summarizer.generation import Summarizer

    return Summarizer


@takes_training_overrides()
def eval_duplicates(
    model_type: str | None = typer.Option(None, "--model-type", help="Cross-validate: biencoder | crossencoder."),
    init: str = typer.Option("minilm", "--init", help="Cross-validation: starting weights of every fold's model."),
    split: str = typer.Option("doctor", "--split", help="Cross-validation folds: doctor | grouped."),
    preset: str = typer.Option("quick", "--preset", help="quick | full"),
    folds: int | None = typer.Option(None, "--folds", min=2, help="Number of folds (default: 3 quick, 5 full)."),
    seed: int = typer.Option(0, "--seed"),
    dev_groups: int | None = typer.Option(
        None, "--dev-groups", min=1, help="Cross-validation: fewest doctors/groups per fold's dev part (default: 1)."
    ),
    model: str | None = typer.Option(None, "--model", help="Score a trained model on --pairs instead."),
    pairs: Path | None = typer.Option(None, "--pairs", help="Labelled pairs JSONL (text_a, text_b, label)."),
    threshold: float | None = typer.Option(
        None,
        "--threshold",
        callback=finite,
        help="With --model: decision threshold (default: the one saved with a cross-validation fold model; else a "
        "cross-encoder's own decision boundary: 0.5, or with a prior its median training cosine).",
    ),
    threshold_rule: str = typer.Option(
        "auto",
        "--threshold-rule",
        help="Cross-validation: auto (a cross-encoder's own decision boundary: 0.5, or with a prior its median "
        "training cosine, as a trained model applies it; a bi-encoder's thresholds tuned on the fold's dev part) | "
        "dev (tuned on dev) | boundary.",
    ),
    quantize: bool = typer.Option(False, "--quantize", help="Score with int8 dynamic quantisation (CPU)."),
    save_models: Path | None = typer.Option(
        None, "--save-models", help="Cross-validation: save each fold's model, thresholds and test pairs here."
    ),
    scores_out: Path | None = typer.Option(
        None, "--scores-out", help="Cross-validation: write every dev and test pair's score here (JSONL)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (fractions) instead of tables."),
    overrides: Mapping[str, Any] = NO_OVERRIDES,
    max_pairs: int | None = typer.Option(
        None, "--max-pairs", min=1, help="Train each fold on at most this many pairs."
    ),
    device: str | None = DEVICE,
) -> None:
    """Cross-validate a duplicate detector on MQP (one model per fold), or score a trained model on a labelled pairs
    file."""
    from medfaq.common.runtime import quantize_linear
    from medfaq.eval.duplicate_detection import (
        CV_FOLDS,
        MIN_DEV_GROUPS,
        DuplicateEvaluator,
        PairsEvaluator,
        check_threshold_rule,
        save_fold,
    )
    from medfaq.retriever.runs import check_output
    from medfaq.retriever.training.config import make_config
    from medfaq.retriever.training.pair_data import mqp_pairs, read_pairs_file, subsample
    from medfaq.retriever.training.pair_models import as_scorer, load_pair_scorer, saved_threshold, train_pair_model

    def echo(text: str) -> None:
        typer.echo(text, err=as_json)

    if model is not None or pairs is not None:
        if model is None or pairs is None or model_type is not None:
            raise MedfaqError("score a trained model with --model DIR --pairs FILE (without --model-type)")
        labelled = read_pairs_file(pairs)
        scorer = load_pair_scorer(model, device=device, quantize=quantize)
        chosen = threshold if threshold is not None else saved_threshold(model)
        result = PairsEvaluator(labelled, chosen, print_fn=echo)(scorer)
    else:
        if model_type is None:
            raise MedfaqError("give --model-type biencoder|crossencoder (cross-validation) or --model DIR --pairs FILE")
        check_threshold_rule(threshold_rule, has_boundary=model_type != "biencoder")
        config = make_config(model_type, "mqp", preset, init=init, seed=seed, **overrides)
        resolve_training_models(config)
        if save_models is not None:
            if quantize:
                raise MedfaqError("--save-models keeps the full-precision models; drop --quantize")
            check_out_dir(save_models, force=False)
        n_folds, min_dev_groups = folds or CV_FOLDS[preset], dev_groups or MIN_DEV_GROUPS
        if scores_out is not None:
            check_not_an_input(scores_out, *map(local_model_dir, training_models(config)), option="--scores-out")
            check_output(scores_out)
        evaluator = DuplicateEvaluator(
            mqp_pairs(),
            split,
            n_folds,
            seed,
            min_dev_groups=min_dev_groups,
            print_fn=echo,
            scores_path=scores_out,
            threshold_rule=threshold_rule,
        )

        fold_configs = []

        def fit(train, dev, fold):
            train = subsample(train, max_pairs, seed)
            fold_configs.append(replace(config, n_train_pairs=len(train)))
            trained = train_pair_model(train, fold_configs[-1], device, dev)
            if quantize:
                quantize_linear(trained.cpu())
            return as_scorer(trained, fold_configs[-1])

        def after_fold(fold, scorer, metrics, test_pairs):
            metrics.update(fold_configs[fold].extra.get("history", {}))
            if save_models is not None:
                save_fold(save_models / f"fold-{fold + 1}", scorer.model, fold_configs[fold], metrics, test_pairs)

        result = evaluator(fit, after_fold=after_fold)
        result.update(model_type=model_type, init=init, preset=preset, quantized=quantize)
    if as_json:
        typer.echo(json.dumps(result))


@takes_stage_flags(without=("top_k",))  # the metrics read the top 10
def eval_retrieval(
    index: Path | None = typer.Option(
        None,
        "--index",
        help="Index directory (of the benchmark's corpus); with one --benchmark DIR: default DIR/index.",
    ),
    queries: Path | None = typer.Option(None, "--queries", help="queries.jsonl (BEIR, or medfaq id/question lines)."),
    qrels: Path | None = typer.Option(None, "--qrels", help="qrels.tsv (BEIR) or TREC qrels."),
    benchmarks: list[Path] | None = typer.Option(
        None,
        "--benchmark",
        help="A benchmark directory (`medfaq data make-benchmark`): its queries.jsonl, qrels.tsv and index, instead of "
        "--index/--queries/--qrels; repeatable: the results are reported by kind, real FAQ banks first.",
    ),
    compare: bool = typer.Option(False, "--compare", help="Evaluate BM25/dense/hybrid/rerank/summary variants."),
    systems: str | None = typer.Option(
        None, "--systems", help="With --compare: only these, comma-separated (e.g. bm25,summary-hybrid+rerank)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the metrics as JSON."),
    run_out: Path | None = typer.Option(None, "--run-out", help="Write the run as a TREC file (not with --compare)."),
    save_threshold: bool = typer.Option(
        False,
        "--save-threshold",
        help="Store this configuration's dev-calibrated threshold in the index's pipeline.json.",
    ),
    flags: StageFlags = NO_STAGE_FLAGS,
    min_words: int = typer.Option(0, "--min-words", min=0, help="Evaluate only the questions of at least N words."),
    summaries: Path | None = typer.Option(
        None, "--summaries", help="With --compare: JSONL of questions and their 'summary' (`medfaq summarize --input`)."
    ),
    query_ids: Path | None = typer.Option(
        None,
        "--query-ids",
        help="Also report each system on only the questions listed in FILE (ids one a line, e.g. the clean ones of "
        "`medfaq data audit --clean-ids DIR`); with --benchmark, a DIR holds each benchmark's <name>.txt.",
    ),
) -> None:
    """Recall@1/5/10, MRR@10, nDCG@10, P@5 on the judged test queries; with out-of-scope queries also abstention
    AUROC and accuracy at the threshold calibrated on the dev queries. `--compare` puts the variants side by side.
    Benchmarks of a declared kind are reported under its heading, real FAQ banks (the evidence for defaults) first."""
    from medfaq.eval.benchmarks import by_kind, kind_heading
    from medfaq.eval.retrieval import format_table

    if compare and (run_out is not None or save_threshold):
        raise MedfaqError("--run-out and --save-threshold evaluate one configuration; leave out --compare")
    if summaries is not None and not compare:
        raise MedfaqError("--summaries is for --compare")
    targets = _retrieval_targets(index, queries, qrels, benchmarks or [])
    if len(targets) > 1 and (run_out is not None or save_threshold or index is not None):
        raise MedfaqError("--index, --run-out and --save-threshold are for one benchmark; give one --benchmark")
    known = read_summaries(summaries) if summaries is not None else None
    listed = {t.name: _listed_ids(query_ids, t.name, len(targets) > 1) for t in targets} if query_ids else {}
    results = {
        target.name: _evaluate_retrieval(
            target, flags, compare, systems, as_json, run_out, save_threshold, min_words, known, listed.get(target.name)
        )
        for target in targets
    }
    kinds = by_kind(results)
    grouped = bool(benchmarks) or kinds[0][0] != ""
    if as_json:
        ordered = [{"benchmark": name, **results[name]} for _, names in kinds for name in names]
        typer.echo(json.dumps({"benchmarks": ordered} if benchmarks else ordered[0], indent=2))
        return
    for kind, names in kinds:
        if grouped:
            typer.echo(f"== {kind_heading(kind)} ==")
        for name in names:
            result = results[name]
            if grouped:
                typer.echo(f"{name}: {result['judged_test']} judged test questions")
            typer.echo(format_table([(row["system"], row) for row in _rows_with_listed(result["rows"])]))
            if result.get("skipped"):
                typer.echo(f"skipped (stage missing): {', '.join(result['skipped'])}")
                for reason in result["missing_stages"]:
                    typer.echo(f"  {reason}")
            if "saved" in result:
                threshold = result["rows"][0]["threshold"]
                typer.echo(f"threshold {threshold:.4f} of {result['threshold_key']} saved to {result['saved']}")


@dataclass(frozen=True)
class RetrievalTarget:
    """One benchmark to evaluate: its `name` (from its benchmark.json, else its directory's), index, queries and
    qrels."""

    name: str
    index: Path
    queries: Path
    qrels: Path


def _retrieval_targets(
    index: Path | None, queries: Path | None, qrels: Path | None, benchmarks: list[Path]
) -> list[RetrievalTarget]:
    """The benchmarks `medfaq eval retrieval` evaluates: each --benchmark DIR, or --index with --queries and --qrels."""
    if benchmarks:
        if queries is not None or qrels is not None:
            raise MedfaqError("--benchmark DIR reads DIR/queries.jsonl and DIR/qrels.tsv; leave out --queries/--qrels")
        targets = [
            RetrievalTarget(_benchmark_name(path), index or path / "index", path / "queries.jsonl", path / "qrels.tsv")
            for path in benchmarks
        ]
        names = [target.name for target in targets]
        if len(set(names)) < len(names):
            raise MedfaqError(f"--benchmark: two directories hold the same benchmark ({', '.join(names)})")
        return targets
    for value, option in ((index, "--index"), (queries, "--queries"), (qrels, "--qrels")):
        if value is None:
            raise MedfaqError(f"Missing option '{option}' (or give --benchmark DIR)")
    return [RetrievalTarget(_benchmark_name(queries.parent), index, queries, qrels)]


def _benchmark_name(directory: Path) -> str:
    """The name in `directory`'s benchmark.json, else the directory's own name."""
    info = directory / "benchmark.json"
    try:
        return json.loads(info.read_text(encoding="utf-8")).get("name") or directory.name
    except (OSError, ValueError, AttributeError):
        return directory.name


def _listed_ids(query_ids: Path, name: str, several: bool) -> set[str]:
    """The ids `--query-ids` lists for benchmark `name`: the file, or in a directory `<name>.txt`."""
    path = query_ids / f"{name}.txt" if query_ids.is_dir() else query_ids
    if several and not query_ids.is_dir():
        raise MedfaqError(f"--query-ids {query_ids}: with several benchmarks, give a directory of <benchmark>.txt")
    if not path.is_file():
        raise MedfaqError(f"--query-ids: {path} not found")
    return set(path.read_text(encoding="utf-8").split())


def _evaluate_retrieval(
    target: RetrievalTarget,
    flags: StageFlags,
    compare: bool,
    systems: str | None,
    as_json: bool,
    run_out: Path | None,
    save_threshold: bool,
    min_words: int,
    known: dict[str, str] | None,
    listed: set[str] | None,
) -> dict[str, Any]:
    """Evaluate one benchmark as `medfaq eval retrieval` asks: its result (``rows`` of metrics, one per system)."""
    from medfaq.common.ranking import read_qrels
    from medfaq.eval.benchmarks import benchmark_kind, read_beir_queries
    from medfaq.eval.retrieval import RetrievalEvaluator, compare_variants, run_pipeline, stages_needed
    from medfaq.index.faq_index import FaqIndex

    index, queries, qrels = target.index, target.queries, target.qrels
    if run_out is not None:
        check_not_an_input(
            run_out, queries, qrels, *search_inputs(index, read_config(index, flags.overrides())), option="--run-out"
        )
        check_output(run_out)
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
    result: dict[str, Any] = {"kind": benchmark_kind(target.name)} if benchmark_kind(target.name) else {}
    result |= {"queries": len(texts), "judged_test": len(evaluator.test_qrels())}
    if listed is not None:
        if not listed & set(texts):
            raise MedfaqError(f"--query-ids: none of the ids listed for {target.name} is a question of {queries}")
        evaluator.listed = evaluator.restricted(listed)
        result |= {"listed": len(listed & set(texts)), "listed_judged_test": len(evaluator.listed.test_qrels())}
    config = flags.apply(read_config(index), top_k=10)
    faq_index = FaqIndex.load(index)
    if compare:
        config = config.updated(entities=False)
        wanted = [name.strip() for name in systems.split(",")] if systems else None
        stages, missing = shared_cache().optional_stages(config, stages_needed(wanted))
        table, skipped = compare_variants(
            faq_index, texts, evaluator, config, **stages, progress=not as_json, systems=wanted, summaries=known
        )
        return result | {"rows": [{"system": n, **m} for n, m in table], "skipped": skipped, "missing_stages": missing}
    config = config.updated(entities=config.key_terms, abstain=False, log_unanswered=False)
    pipeline = build_pipeline(faq_index, config)
    run, confidences, responses = run_pipeline(pipeline, texts, progress=not as_json)
    metrics = evaluator(run, confidences)
    result |= {"rows": [{"system": _describe(config), **metrics}], "config": config.to_dict()}
    if run_out is not None:
        write_run(run_out, list(texts), responses, "trec", "medfaq")
    if save_threshold:
        if "threshold" not in metrics:
            raise MedfaqError("--save-threshold needs out-of-scope and dev queries to calibrate on")
        result["saved"] = str(store_threshold(index, config, metrics["threshold"]))
        result["threshold_key"] = config.threshold_key
    return result


def _rows_with_listed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each system's row, followed by its row on the listed questions (`--query-ids`) where there is one."""
    out = []
    for row in rows:
        out.append(row)
        if "listed" in row:
            out.append({**row["listed"], "system": f"{row['system']} [listed ids]"})
    return out


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


def _describe(config: PipelineConfig) -> str:
    parts = [config.mode if config.query_source == "raw" else f"{config.mode} on {config.query_source}"]
    parts += ["rerank"] * config.rerank + ["likelihood"] * config.likelihood
    return " + ".join(parts)
