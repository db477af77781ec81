"""The summarizer's likelihood as a ranking signal: each question scored once, every fusion replayed from the scores.

``score``: for each query set, the dense top `--depth` of each question (the benchmark index's pipeline.json, no
abstention) and, for each hit, the summarizer's summed log P(FAQ question | question), its token count and
log P(FAQ question | no question) (summarizer/likelihood.py), stored in ``OUT/<set>.jsonl``; questions already
stored are skipped, so an interrupted run resumes.

``replay``: every candidate setting (per token or summed, prior weight, RRF weight and k) goes through the pipeline's
own rescoring (:meth:`Pipeline.rescore`) on the stored hits and scores; development sets choose the setting by the
rule below, written before any scoring, and the test sets are then reported with it, with and without the gate.

Query sets (``--sets``):

* development: ``meqsum-valid`` and ``mediqa2021-valid`` (the validation CHQs of MeQSum and MEDIQA 2021 against
  the corpus of their benchmark, gold = the corpus entry of their FAQ) and ``quebec-dev`` (the in-scope dev half of
  the quebec benchmark): the development queries of the reranker's fusion (docs/results.md);
* test: the judged test queries of each benchmark, and ``medquad-chq-long`` (its CHQs of more than 60 words: a
  store of their own, else the long rows of the ``medquad-chq`` store).

The rule: (1) the highest worst development-set ΔR@1 against dense search; (2) then the fewest development questions
lost at rank 1; (3) then the largest summed ΔMRR@10; (4) then the smaller likelihood weight and larger k.

    python experiments/summary_ranking.py score --summarizer NAME --out DIR [--benchmarks ~/.medfaq/benchmarks]
        [--sets meqsum-valid,...] [--depth 10]
    python experiments/summary_ranking.py replay --out DIR [--json report.json]
    python experiments/summary_ranking.py latency --summarizer NAME [--set medquad-chq-long] [--questions 30]

``latency``: for the full and the trimmed vocabulary (summarizer/likelihood.py), in fp32, bf16 (the trimmed one)
and int8 (PyTorch dynamic quantisation): milliseconds the likelihood stage takes per question for N = 5, 10 and 20
candidates (the dense top N of the questions of one set, or of ``--queries``, after 3 warm-ups, the priors
cached), the rank agreement with full fp32 on the top 10 (Kendall tau) and R@1 of the likelihood alone; and the
share of those questions the gate (`rerank_margin` 0.05) would score, which gives the gated latency: dense search
alone for the others. ``--variants bank/bf16,...`` measures only those beside full fp32.

Results: docs/experiments/likelihood-stage.md, "The summarizer as a ranker (issue 42): summary likelihood over the
top hits, and ECL with retrieval negatives"; "The summarizer ranks the bank it was trained for (issue 54): per-index
likelihood stage, bank-question golds, a trimmed vocabulary", its "What the stage costs: trimmed vocabulary and int8
against full fp32"; "The likelihood stage in one packed forward pass (issue 54: five times cheaper)".
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from medfaq.common.runtime import MedfaqError, medfaq_home
from medfaq.eval.script_args import print_report
from medfaq.index.datasets import BENCHMARKS
from medfaq.retriever.decisions.stage_choice import Replay, choose_on_dev
from medfaq.retriever.pipeline import RERANK_MARGIN

DEV_SETS = ("meqsum-valid", "mediqa2021-valid", "quebec-dev")
TEST_SETS = tuple(BENCHMARKS)
LONG_WORDS = 60  # medquad-chq-long: the medquad-chq questions of more than this many words
GRID = {
    "likelihood_per_token": (True, False),
    "likelihood_prior": (0.0, 0.5, 1.0),
    "likelihood_weight": (0.5, 1.0, 2.0, 3.0),
    "rerank_rrf_k": (10, 60),
}
EQUAL = {"likelihood_per_token": True, "likelihood_prior": 1.0, "likelihood_weight": 3.0, "rerank_rrf_k": 60}
ALONE = {**EQUAL, "likelihood_weight": 1000.0}
"""Shown beside the chosen setting on the test sets, not chosen: the likelihood ranking weighing as much as the
retrieval ranking (what the signal does when it is let to act), and the top hits ordered by it alone."""
CUTOFF = 10
DEPTHS = (5, 10, 20)  # candidates timed by `latency`
WARM_UPS = 3


def query_set(name: str, benchmarks: Path) -> tuple[Path, dict[str, str], dict[str, dict[str, int]]]:
    """(benchmark directory, questions by id, qrels) of query set `name`."""
    from medfaq.eval.benchmarks import Benchmark
    from medfaq.index.pair_sources import load_jsonl_rows

    if name == "medquad-chq-long":
        directory, texts, qrels = query_set("medquad-chq", benchmarks)
        texts = {q: text for q, text in texts.items() if len(text.split()) > LONG_WORDS}
        return directory, texts, {q: qrels[q] for q in texts}
    base = name.removesuffix("-valid") if name in ("meqsum-valid", "mediqa2021-valid") else name
    base = "quebec" if name == "quebec-dev" else base
    directory = benchmarks / base
    benchmark = Benchmark.load(directory)
    if name in ("meqsum-valid", "mediqa2021-valid"):
        by_text = {" ".join(row["text"].lower().split()): row["_id"] for row in benchmark.corpus}
        rows = load_jsonl_rows(base, "valid.jsonl")
        texts = {f"valid-{i}": row["chq"] for i, row in enumerate(rows)}
        qrels = {f"valid-{i}": {by_text[" ".join(row["faq"].lower().split())]: 1} for i, row in enumerate(rows)}
        return directory, texts, qrels
    texts = benchmark.query_texts()
    keep = benchmark.dev_ids if name == "quebec-dev" else set(texts) - benchmark.dev_ids
    qrels = {q: docs for q, docs in benchmark.qrels.items() if q in keep and q not in benchmark.ood_ids}
    return directory, {q: texts[q] for q in qrels}, qrels


def dense_pipeline(index_dir: Path, depth: int) -> Any:
    """Dense search of the raw question over the index in `index_dir` with its pipeline.json's other settings, no
    other stage and no abstention: the top `depth` hits the likelihood is scored on."""
    from medfaq.index.faq_index import FaqIndex
    from medfaq.retriever.pipeline import Pipeline
    from medfaq.retriever.pipeline_file import read_config

    config = read_config(index_dir).replace(
        top_k=depth,
        abstain=False,
        log_unanswered=False,
        entities=False,
        summarize=False,
        query_source="raw",
        rerank=False,
        likelihood=False,
    )
    return Pipeline(FaqIndex.load(index_dir), config)


def fill_stores(
    args: argparse.Namespace, settings: dict[str, Any], row_for: Callable[[str, Any, str], dict[str, Any]]
) -> dict[str, dict[str, int]]:
    """Store ``row_for(set name, dense pipeline, question)`` (with the question's ``qid``) for the first `args.limit`
    questions of each set of `args.sets` in ``OUT/<set>.jsonl``, skipping those already stored, so an interrupted run
    resumes; `settings` go to ``OUT/summarizer.json``. Returns how many questions each set scored and holds."""
    from tqdm.auto import tqdm

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summarizer.json").write_text(json.dumps(settings) + "\n", encoding="utf-8")
    counts = {}
    for name in args.sets:
        directory, texts, _ = query_set(name, args.benchmarks)
        store = args.out / f"{name}.jsonl"
        done = {json.loads(line)["qid"] for line in store.open(encoding="utf-8")} if store.is_file() else set()
        pipeline = dense_pipeline(directory / "index", args.depth)
        todo = [q for q in list(texts)[: args.limit] if q not in done]
        with store.open("a", encoding="utf-8") as out:
            for qid in tqdm(todo, desc=name, unit="question"):
                out.write(json.dumps({"qid": qid, **row_for(name, pipeline, texts[qid])}) + "\n")
                out.flush()
        counts[name] = {"scored": len(todo), "stored": len(done) + len(todo)}
    return counts


def score(args: argparse.Namespace) -> dict[str, Any]:
    from medfaq.retriever.stages.rewrite import locate_summarizer
    from medfaq.summarizer.likelihood import SummaryLikelihood

    scorer = SummaryLikelihood.load(locate_summarizer(args.summarizer), quantize=args.quantize)
    spent: dict[str, list[float]] = {}

    def row_for(name: str, pipeline: Any, question: str) -> dict[str, Any]:
        hits = pipeline.run(question).hits
        questions = [hit.question for hit in hits]
        start = time.perf_counter()
        given = scorer.token_scores(question, questions)
        prior = scorer.prior_scores(questions)
        spent.setdefault(name, []).append((time.perf_counter() - start) * 1000)
        return {
            "hits": [hit.to_dict() for hit in hits],
            "given": given.log_prob.tolist(),
            "tokens": given.tokens.tolist(),
            "prior": prior.log_prob.tolist(),
        }

    counts = fill_stores(args, {"summarizer": scorer.name, "depth": args.depth}, row_for)
    for name, times in spent.items():
        counts[name]["median_ms_per_question"] = sorted(times)[len(times) // 2]
    return {"summarizer": scorer.name, "sets": counts}


VARIANTS = (("full", "fp32"), ("bank", "fp32"), ("bank", "bf16"), ("bank", "int8"), ("full", "int8"))
"""(vocabulary, precision) of each likelihood stage `latency` measures; the first is the reference."""


def latency(args: argparse.Namespace) -> dict[str, Any]:
    """Per variant of :data:`VARIANTS`: ms per question for N = 5, 10 and 20 candidates (priors cached, as in steady
    serving: a first pass over the questions computes them), and, on the top 10, the rank agreement with the
    reference (Kendall tau of the candidates' scores) and R@1 of the likelihood alone (per token, prior 1); the
    share of questions the gate scores, and the gated end-to-end latency (dense search alone for the others)."""
    import numpy as np
    import torch
    from scipy.stats import kendalltau

    from medfaq.retriever.stages.rewrite import locate_summarizer
    from medfaq.summarizer.likelihood import SummaryLikelihood

    torch.set_num_threads(args.threads)
    if args.queries is not None:
        if args.index is None or args.qrels is None:
            raise MedfaqError("--queries needs --qrels and --index")
        index_dir, (texts, qrels) = args.index, part_queries(args.queries, args.qrels)
    else:
        directory, texts, qrels = query_set(args.set, args.benchmarks)
        index_dir = args.index or directory / "index"
    qids = list(texts)[: args.questions + WARM_UPS]
    pipeline = dense_pipeline(index_dir, max(DEPTHS))
    found = [pipeline.run(texts[q]).hits for q in qids]
    dense_ms = np.array([pipeline.run(texts[q]).timings_ms["total"] for q in qids[WARM_UPS:]])
    gated = np.array([len(hits) > 1 and hits[0].score - hits[1].score < RERANK_MARGIN for hits in found[WARM_UPS:]])
    bank = [record.question for record in pipeline.index.records()]
    report: dict[str, Any] = {
        "set": str(args.queries or args.set),
        "questions": len(qids) - WARM_UPS,
        "threads": args.threads,
        "dense_p50_ms": float(np.median(dense_ms)),
        "share_scored_with_gate": float(np.mean(gated)),
        "rows": [],
    }
    model = locate_summarizer(args.summarizer)
    reference: list[np.ndarray] = []
    for vocabulary, precision in chosen_variants(args.variants):
        arithmetic = "bf16" if precision == "bf16" else "fp32"
        scorer = SummaryLikelihood.load(
            model, quantize=precision == "int8", vocabulary=vocabulary, precision=arithmetic
        )
        scorer.keep(bank)
        scores = [
            np.array(scorer.score(texts[q], [h.question for h in hits[:CUTOFF]], prior_weight=1.0, per_token=True))
            for q, hits in zip(qids, found, strict=True)
        ]
        reference = reference or scores
        taus = [kendalltau(ours, theirs).statistic for ours, theirs in zip(scores, reference, strict=True)]
        firsts = [
            hits[int(np.argmax(row))].id in qrels.get(q, {}) for q, hits, row in zip(qids, found, scores, strict=True)
        ]
        row: dict[str, Any] = {
            "vocabulary": vocabulary,
            "precision": precision,
            "kept_tokens": len(scorer._vocabulary) if scorer._vocabulary is not None else None,
            "kendall_tau_top10": float(np.nanmean(taus)),
            "likelihood_alone_r1": 100 * float(np.mean(firsts)),
        }
        for depth in DEPTHS:
            spent = []
            for number, (q, hits) in enumerate(zip(qids, found, strict=True)):
                start = time.perf_counter()
                scorer.score(texts[q], [hit.question for hit in hits[:depth]], prior_weight=1.0, per_token=True)
                if number >= WARM_UPS:
                    spent.append((time.perf_counter() - start) * 1000)
            times = np.array(spent)
            with_gate = np.where(gated, times, 0.0) + dense_ms
            row[f"n{depth}"] = {
                "p50_ms": float(np.median(times)),
                "p95_ms": float(np.percentile(times, 95)),
                "gated_end_to_end_p50_ms": float(np.median(with_gate)),
                "gated_end_to_end_p95_ms": float(np.percentile(with_gate, 95)),
                "ungated_end_to_end_p50_ms": float(np.median(times + dense_ms)),
                "ungated_end_to_end_p95_ms": float(np.percentile(times + dense_ms, 95)),
            }
        report["rows"].append(row)
        del scorer
    return report


def chosen_variants(text: str | None) -> list[tuple[str, str]]:
    """The variants `--variants` names ("bank/bf16,full/int8"; None: all), the reference first."""
    if text is None:
        return list(VARIANTS)
    named = [tuple(part.strip().split("/", 1)) for part in text.split(",") if part.strip()]
    unknown = [f"{'/'.join(v)}" for v in named if v not in VARIANTS]
    if unknown:
        raise MedfaqError(f"unknown variants {unknown}; choose from {', '.join('/'.join(v) for v in VARIANTS)}")
    return [VARIANTS[0], *(v for v in VARIANTS[1:] if v in named)]


def part_queries(queries: Path, qrels: Path) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """The judged questions of a query file (a `medfaq data split-benchmark` part) and their judgements."""
    from medfaq.common.ranking import read_qrels
    from medfaq.eval.benchmarks import read_beir_queries

    judged = read_qrels(qrels)
    return {row["_id"]: row["text"] for row in read_beir_queries(queries) if row["_id"] in judged}, judged


def replay_set(rows: list[dict[str, Any]], qrels: dict[str, dict[str, int]], changes: dict[str, Any] | None):
    """Metrics of dense search (`changes` None) or of the likelihood stage with `changes`, and the ids of the
    questions answered at rank 1."""
    from medfaq.common.ranking import ranking_metrics
    from medfaq.retriever.decisions.likelihood_choice import replayed

    run = {
        row["qid"]: {hit.id: float(CUTOFF - rank) for rank, hit in enumerate(hits[:CUTOFF])}
        for row, hits in zip(rows, replayed(rows, changes), strict=True)
    }
    metrics, per_query = ranking_metrics(run, {q: qrels[q] for q in run})
    return metrics, {q for q, values in per_query.items() if values["recall@1"] > 0}


def load_rows(
    out: Path, name: str, benchmarks: Path, limit: int | None = None
) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """The stored rows of query set `name` (``medquad-chq-long``: its own store, else the long rows of
    ``medquad-chq``'s), each with its question, the first `limit` of them when given, and the set's qrels."""
    _, texts, qrels = query_set(name, benchmarks)
    stored = name
    if name == "medquad-chq-long" and not (out / f"{name}.jsonl").is_file():
        stored = "medquad-chq"
    path = out / f"{stored}.jsonl"
    if not path.is_file():
        raise MedfaqError(f"{path} not found: run `score` for {name} first")
    rows = [json.loads(line) for line in path.open(encoding="utf-8")]
    rows = [{**row, "text": texts[row["qid"]]} for row in rows if row["qid"] in texts]
    return (rows[:limit] if limit else rows), qrels


def report_tests(load, replay_one: Replay, systems: list[tuple[str, Any]]) -> dict[str, Any]:
    """Dense search and each (label, setting) of `systems` on every test set `load(name)` returns rows for."""
    report: dict[str, Any] = {}
    for name in [*TEST_SETS, "medquad-chq-long"]:
        try:
            rows, qrels = load(name)
        except MedfaqError as error:
            report[name] = {"missing": str(error)}
            continue
        base, base_firsts = replay_one(rows, qrels, None)
        result = {"questions": len(rows), "dense": base}
        for label, setting in systems:
            metrics, firsts = replay_one(rows, qrels, setting)
            result[label] = {**metrics, "lost": len(base_firsts - firsts), "gained": len(firsts - base_firsts)}
        report[name] = result
    return report


def replay_report(
    args: argparse.Namespace,
    replay_one: Replay,
    grid: dict[str, tuple],
    tie_break,
    systems: Callable[[dict], list[tuple[str, Any]]],
) -> dict[str, Any]:
    """Choose a setting of `grid` (every combination of its values) on the development sets
    (:func:`choose_on_dev`), then report the test sets with the `systems(chosen)` (label, setting) pairs beside
    dense search."""
    settings = [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]
    dev = {name: load_rows(args.out, name, args.benchmarks, args.limit) for name in DEV_SETS}
    candidates, dense = choose_on_dev(dev, replay_one, settings, tie_break)
    chosen = candidates[0]["setting"]
    return {
        "limit": args.limit,
        "dev_questions": {name: len(rows) for name, (rows, _) in dev.items()},
        "dense_dev": dense,
        "candidates": candidates,
        "chosen": chosen,
        "test": report_tests(
            lambda name: load_rows(args.out, name, args.benchmarks, args.limit), replay_one, systems(chosen)
        ),
    }


def replay(args: argparse.Namespace) -> dict[str, Any]:
    def systems(chosen: dict[str, Any]) -> list[tuple[str, Any]]:
        return [
            ("likelihood", chosen),
            ("likelihood-gated", {**chosen, "rerank_margin": RERANK_MARGIN}),
            ("likelihood-equal (not chosen)", EQUAL),
            ("likelihood alone (not chosen)", ALONE),
        ]

    return replay_report(args, replay_set, GRID, lambda s: (s["likelihood_weight"], -s["rerank_rrf_k"]), systems)


def print_tables(report: dict[str, Any]) -> None:
    print("\ndevelopment (best 10 candidates by the rule): setting | per set dR@1/dMRR (lost/gained)")
    for candidate in report["candidates"][:10]:
        cells = "; ".join(
            f"{n} {c['delta_r1']:+.1f}/{c['delta_mrr']:+.2f} ({c['lost']}/{c['gained']})"
            for n, c in candidate["sets"].items()
        )
        print(f"{candidate['setting']} | {cells}")
    print(f"\nchosen: {report['chosen']}\n")
    print("| set | questions | system | R@1 | R@5 | MRR@10 | nDCG@10 | lost / gained at rank 1 |")
    print("|---|---:|---|---:|---:|---:|---:|---|")
    for name, result in report["test"].items():
        if "missing" in result:
            continue
        for label in [key for key in result if key != "questions"]:
            m = result[label]
            cells = " | ".join(f"{m[k]:.1f}" for k in ("recall@1", "recall@5", "mrr@10", "ndcg@10"))
            changed = f"{m['lost']} / {m['gained']}" if "lost" in m else ""
            print(f"| {name} | {result['questions']} | {label} | {cells} | {changed} |")


def main(argv: list[str] | None = None) -> None:
    parser, commands, scored = summary_commands(
        "python experiments/summary_ranking.py", __doc__, "store the dense hits and their likelihoods", "scores"
    )
    scored.add_argument("--depth", type=int, default=10, help="hits scored per question")
    scored.add_argument("--quantize", action="store_true", help="int8 linear layers")
    timed = commands.add_parser("latency", help="the likelihood stage's milliseconds per question")
    timed.add_argument("--summarizer", default=None, help="a trained summarizer (default: the best one trained)")
    timed.add_argument("--set", default="medquad-chq-long", help="the query set whose questions are timed")
    timed.add_argument("--questions", type=int, default=30, help="questions timed (after 3 warm-ups)")
    timed.add_argument("--queries", type=Path, default=None, help="time these judged questions instead of --set's")
    timed.add_argument("--qrels", type=Path, default=None, help="the judgements of --queries")
    timed.add_argument("--index", type=Path, default=None, help="the index searched (default: --set's benchmark's)")
    timed.add_argument("--threads", type=int, default=1, help="CPU threads the stage runs on")
    timed.add_argument(
        "--variants", default=None, help="vocabulary/precision pairs measured besides full/fp32 (default: all)"
    )
    timed.add_argument("--out", type=Path, default=Path("."), help=argparse.SUPPRESS)
    timed.add_argument("--benchmarks", type=Path, default=medfaq_home() / "benchmarks")
    timed.add_argument("--json", type=Path, default=None, help="also write the report here")
    run_command(parser.parse_args(argv), {"score": score, "replay": replay, "latency": latency})


def summary_commands(prog: str, doc: str, score_help: str, stored: str):
    """The parser of a summary evaluation, its subcommands and its ``score`` command: ``score`` (--summarizer,
    --sets) and ``replay``, both with --out (the directory of the stored `stored`), --limit, --benchmarks and --json;
    the caller adds its own options and commands."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    scored = commands.add_parser("score", help=score_help)
    scored.add_argument("--summarizer", default=None, help="a trained summarizer (default: the best one trained)")
    scored.add_argument("--sets", default=",".join((*DEV_SETS, *TEST_SETS)), help="comma-separated query sets")
    replayed = commands.add_parser("replay", help="choose the fusion on development sets, report the test sets")
    for command in (scored, replayed):
        command.add_argument("--out", type=Path, required=True, help=f"the directory of the stored {stored}")
        command.add_argument(
            "--limit", type=int, default=None, help="only the first N questions of each set (in the set's order)"
        )
        command.add_argument("--benchmarks", type=Path, default=medfaq_home() / "benchmarks")
        command.add_argument("--json", type=Path, default=None, help="also write the report here")
    return parser, commands, scored


def query_sets(text: str) -> list[str]:
    """The query sets named in the comma-separated `text`; a one-line error for an unknown one."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(names) - {*DEV_SETS, *TEST_SETS, "medquad-chq-long"})
    if unknown:
        raise MedfaqError(f"unknown query set(s) {', '.join(unknown)}")
    return names


def run_command(args: argparse.Namespace, commands: dict[str, Callable[[argparse.Namespace], dict]]) -> None:
    """Run `args.command`: exit with a one-line error on bad input; print replay's tables, any other report."""
    args.out, args.benchmarks = args.out.expanduser(), args.benchmarks.expanduser()
    try:
        if isinstance(getattr(args, "sets", None), str):
            args.sets = query_sets(args.sets)
        report = commands[args.command](args)
    except MedfaqError as error:
        sys.exit(f"error: {error}")
    if args.command == "replay":
        print_tables(report)
        if args.json is not None:
            args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    else:
        print_report(report, args.json)


if __name__ == "__main__":
    main()
