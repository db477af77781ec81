"""Retrieval metrics against hand-computed values, abstention calibration, TREC interoperability, the compare
harness with fake stages, and the `medfaq eval retrieval` / `medfaq bench` commands."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from medfaq.app.cli import app
from medfaq.common.ranking import read_qrels, read_trec_run, write_qrels
from medfaq.common.runtime import MedfaqError
from medfaq.eval.benchmarks import Benchmark
from medfaq.eval.retrieval import (
    VARIANTS,
    CachedReranker,
    RetrievalEvaluator,
    abstention_metrics,
    calibrate_threshold,
    compare_variants,
    ranking_metrics,
    stages_needed,
)
from medfaq.index.faq_index import FaqIndex
from medfaq.retriever.pipeline import PipelineConfig, SearchResponse
from medfaq.retriever.pipeline_file import read_config, store_threshold, write_config
from medfaq.retriever.runs import write_run
from medfaq.retriever.search import Hit
from tests.conftest import FAQ_ROWS

QRELS = {"q1": {"a": 1}, "q2": {"b": 1, "c": 1}, "q3": {"z": 1}}
RUN = {
    "q1": {"x": 3.0, "a": 2.0, "y": 1.0},  # gold at rank 2
    "q2": {"b": 5.0, "d": 4.0, "e": 3.0, "f": 2.5, "c": 2.0},  # golds at ranks 1 and 5
    "q3": {},  # nothing found
}


def test_metrics_equal_hand_computed_values():
    means, per_query = ranking_metrics(RUN, QRELS)
    assert per_query["q1"]["mrr@10"] == pytest.approx(0.5)
    assert per_query["q2"]["recall@1"] == pytest.approx(0.5) and per_query["q2"]["recall@5"] == pytest.approx(1.0)
    assert per_query["q2"]["p@5"] == pytest.approx(0.4)
    assert per_query["q1"]["ndcg@10"] == pytest.approx(1 / math.log2(3))
    ideal = 1 + 1 / math.log2(3)
    assert per_query["q2"]["ndcg@10"] == pytest.approx((1 + 1 / math.log2(6)) / ideal)
    assert means["recall@1"] == pytest.approx(100 * (0 + 0.5 + 0) / 3)
    assert means["mrr@10"] == pytest.approx(100 * (0.5 + 1 + 0) / 3)
    assert means["recall@10"] == pytest.approx(100 * 2 / 3)


def test_mrr_is_cut_at_ten():
    run = {"q1": {f"d{i}": 100.0 - i for i in range(11)} | {"a": 1.0}}  # gold at rank 12
    means, _ = ranking_metrics(run, {"q1": {"a": 1}})
    assert means["mrr@10"] == 0.0


def test_threshold_calibration_and_abstention_metrics():
    assert calibrate_threshold([True, True, False, False], [0.9, 0.8, 0.3, 0.1]) == pytest.approx(0.55)
    assert calibrate_threshold([True, False], [None, None]) == 0.0
    metrics = abstention_metrics(
        test_in_scope=[True, True, False, False],
        test_confidences=[0.9, 0.4, 0.6, None],
        dev_in_scope=[True, False],
        dev_confidences=[0.7, 0.5],
    )
    assert metrics["threshold"] == pytest.approx(0.6)
    assert metrics["auroc"] == pytest.approx(75.0)  # pairs (in, out): 0.9>0.6, 0.9>None, 0.4<0.6, 0.4>None
    assert metrics["accuracy"] == pytest.approx(50.0)  # 0.9 answered, 0.4 abstained, 0.6 answered, None abstained
    assert metrics["answered"] == pytest.approx(50.0) and metrics["ood_abstained"] == pytest.approx(50.0)
    assert "selective_acc" not in metrics
    # answered: 0.9 (gold on top), 0.6 (out of scope: wrong); abstained: 0.4 (in scope: wrong), None (ood: right)
    selective = abstention_metrics(
        [True, True, False, False],
        [0.9, 0.4, 0.6, None],
        [True, False],
        [0.7, 0.5],
        test_correct=[True, True, False, False],
    )
    assert selective["selective_acc"] == pytest.approx(50.0) and selective["precision"] == pytest.approx(50.0)


def test_evaluator_splits_dev_test_and_ood():
    qrels = {"t1": {"a": 1}, "d1": {"b": 1}}
    evaluator = RetrievalEvaluator(qrels, ood_ids={"o1", "o2"}, dev_ids={"d1", "o1"})
    run = {"t1": {"a": 1.0}, "d1": {"x": 1.0}, "o1": {"a": 1.0}, "o2": {"b": 1.0}}
    metrics = evaluator(run, {"t1": 0.9, "d1": 0.8, "o1": 0.2, "o2": 0.3})
    assert metrics["recall@1"] == 100.0  # only the test query t1 counts
    assert metrics["accuracy"] == 100.0 and 0.2 < metrics["threshold"] < 0.8
    assert metrics["selective_acc"] == 100.0 and metrics["precision"] == 100.0  # t1 answered with its gold FAQ
    assert "auroc" not in RetrievalEvaluator(qrels, set(), set())(run, {"t1": 0.5})


def test_trec_run_and_qrels_files_round_trip(tmp_path):
    write_qrels(tmp_path / "qrels.tsv", QRELS)
    write_qrels(tmp_path / "qrels.trec", QRELS, trec=True)
    assert read_qrels(tmp_path / "qrels.tsv") == read_qrels(tmp_path / "qrels.trec") == QRELS
    assert (tmp_path / "qrels.tsv").read_text().splitlines()[0] == "query-id\tcorpus-id\tscore"
    assert (tmp_path / "qrels.trec").read_text().splitlines()[0] == "q1 0 a 1"
    responses = []
    for docs in RUN.values():
        ranked = sorted(docs.items(), key=lambda item: -item[1])
        hits = [Hit(doc, score, rank, doc) for rank, (doc, score) in enumerate(ranked, 1)]
        responses.append(SearchResponse("q", None, [], hits, False))
    write_run(tmp_path / "run.trec", list(RUN), responses, "trec", "test")
    run = read_trec_run(tmp_path / "run.trec")
    assert ranking_metrics(run, QRELS)[0] == ranking_metrics(RUN, QRELS)[0]
    assert (tmp_path / "run.trec").read_text().splitlines()[0] == "q1 Q0 x 1 3.000000 test"


def test_bad_standard_files_are_one_line_errors(tmp_path):
    (tmp_path / "bad.tsv").write_text("q1 a\n")
    with pytest.raises(MedfaqError, match="bad.tsv:1"):
        read_qrels(tmp_path / "bad.tsv")
    (tmp_path / "bad.trec").write_text("q1 Q0 a 1 high tag\n")
    with pytest.raises(MedfaqError, match="not a number"):
        read_trec_run(tmp_path / "bad.trec")


class Echo:
    calls = 0

    def rewrite(self, texts):
        Echo.calls += len(texts)
        return [t.split(",")[0] for t in texts]


class Overlap:
    def __init__(self):
        self.pairs = 0

    def score(self, query, candidates):
        self.pairs += len(candidates)
        words = set(query.lower().split())
        return [len(words & set(c.lower().rstrip("?").split())) / len(words) for c in candidates]


@pytest.fixture(scope="module")
def index(tiny_encoder):
    from medfaq.index.records import FaqRecord
    from tests.conftest import FAQ_ROWS

    return FaqIndex.build([FaqRecord.from_dict(row) for row in FAQ_ROWS], tiny_encoder, progress=False)


class CountingLikelihood:
    """A likelihood stage preferring short questions; counts the pairs it scores."""

    def __init__(self):
        self.pairs = 0

    def score(self, query, candidates, prior_weight, per_token):
        self.pairs += len(candidates)
        return [-len(text) for text in candidates]


def test_compare_runs_every_variant_with_cached_stages(index):
    queries = {"q1": "shingles treated, my aunt asks", "q2": "migraine headaches causes, since monday"}
    evaluator = RetrievalEvaluator({"q1": {"f3": 1}, "q2": {"f5": 1}}, set(), set())
    Echo.calls = 0
    reranker = Overlap()
    likelihood = CountingLikelihood()
    rows, skipped = compare_variants(
        index, queries, evaluator, PipelineConfig(), Echo(), reranker, progress=False, likelihood=likelihood
    )
    assert [name for name, _ in rows] == [name for name, _ in VARIANTS] and not skipped
    assert Echo.calls == 2  # summarized once for all variants
    assert likelihood.pairs == len(queries) * len(FAQ_ROWS)  # every FAQ a candidate, scored once for four variants
    assert stages_needed(["dense", "dense+likelihood-gated"]) == ("likelihood",)
    assert stages_needed(None) == ("rewrite", "rerank", "likelihood")
    assert dict(rows)["summary-bm25"]["recall@1"] == 100.0
    cached = CachedReranker(Overlap())
    cached.score("a b", ["a", "b"])
    assert cached.score("a b", ["b", "c"]) == [0.5, 0.0]
    assert cached.reranker.pairs == 3
    rows, skipped = compare_variants(index, queries, evaluator, PipelineConfig(), progress=False)
    no_models = ["bm25", "dense", "hybrid", "hybrid-w2", "hybrid-w3"]
    assert [name for name, _ in rows] == no_models and len(skipped) == len(VARIANTS) - len(no_models)
    only, _ = compare_variants(index, queries, evaluator, PipelineConfig(), progress=False, systems=["dense"])
    assert [name for name, _ in only] == ["dense"]
    with pytest.raises(MedfaqError, match="unknown system"):
        compare_variants(index, queries, evaluator, PipelineConfig(), progress=False, systems=["best"])
    Echo.calls = 0
    known = {queries["q1"]: "how is shingles treated"}
    given, _ = compare_variants(
        index, queries, evaluator, PipelineConfig(), Echo(), progress=False, systems=["summary-bm25"], summaries=known
    )
    assert Echo.calls == 1 and dict(given)["summary-bm25"]["recall@1"] == 100.0  # q2 alone is summarized


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory, index):
    """A tiny benchmark (3 in-scope queries, 1 dev, 2 out of scope) next to its index."""
    out = tmp_path_factory.mktemp("bench")
    queries = [
        {"_id": "q1", "text": "How is shingles treated?", "metadata": {"split": "test", "ood": False}},
        {"_id": "q2", "text": "what causes migraine headaches", "metadata": {"split": "test", "ood": False}},
        {"_id": "q3", "text": "symptoms of type 2 diabetes", "metadata": {"split": "dev", "ood": False}},
        {"_id": "o1", "text": "best pizza in town", "metadata": {"split": "dev", "ood": True}},
        {"_id": "o2", "text": "car insurance quotes", "metadata": {"split": "test", "ood": True}},
    ]
    qrels = {"q1": {"f3": 1}, "q2": {"f5": 1}, "q3": {"f2": 1}}
    Benchmark("tiny", [], queries, qrels).save(out)
    index.save(out / "index")
    return out


def medfaq(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def bench_args(bench_dir) -> list:
    """The index, queries and qrels options of `medfaq eval retrieval` for the tiny benchmark."""
    return [
        "--index",
        bench_dir / "index",
        "--queries",
        bench_dir / "queries.jsonl",
        "--qrels",
        bench_dir / "qrels.tsv",
    ]


def test_eval_retrieval_cli(bench_dir, tmp_path):
    args = bench_args(bench_dir)
    result = medfaq("eval", "retrieval", *args, "--mode", "bm25", "--json", "--run-out", tmp_path / "run.trec")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["judged_test"] == 2 and data["rows"][0]["recall@1"] == 100.0
    assert {"auroc", "accuracy", "threshold"} <= set(data["rows"][0])
    assert {"q1", "q2", "q3"} <= set(read_trec_run(tmp_path / "run.trec"))
    table = medfaq("eval", "retrieval", *args, "--compare")
    assert table.exit_code == 0 and "hybrid" in table.stdout and "skipped" in table.stdout
    long_only = json.loads(medfaq("eval", "retrieval", *args, "--mode", "bm25", "--json", "--min-words", "4").stdout)
    assert long_only["queries"] == 4 and long_only["judged_test"] == 2  # "car insurance quotes" is left out
    before = read_config(bench_dir / "index")
    saved = medfaq("eval", "retrieval", *args, "--mode", "bm25", "--save-threshold")
    assert saved.exit_code == 0, saved.output
    config = read_config(bench_dir / "index")
    assert config.abstain and config.mode == before.mode and "bm25@raw saved" in saved.stdout
    assert set(config.thresholds) == {"bm25@raw"}
    threshold = config.thresholds["bm25@raw"]
    # the command line applies the threshold of the configuration that runs, and no other configuration's
    calibrated = json.loads(medfaq("search", "--index", bench_dir / "index", "--json", "--mode", "bm25", "zzz").stdout)
    assert calibrated["abstained"] is (calibrated["confidence"] is None or calibrated["confidence"] < threshold)
    store_threshold(bench_dir / "index", PipelineConfig(mode="dense"), 1e9)
    store_threshold(bench_dir / "index", PipelineConfig(mode="bm25"), -1e9)
    dense = json.loads(medfaq("search", "--index", bench_dir / "index", "--json", "--mode", "dense", "zzz").stdout)
    bm25 = json.loads(medfaq("search", "--index", bench_dir / "index", "--json", "--mode", "bm25", "shingles").stdout)
    assert dense["abstained"] is True and bm25["abstained"] is False


def test_eval_retrieval_one_line_errors(bench_dir, tmp_path):
    args = ["--index", bench_dir / "index", "--queries", bench_dir / "queries.jsonl"]
    missing = medfaq("eval", "retrieval", *args, "--qrels", tmp_path / "none.tsv")
    assert missing.exit_code == 2 and missing.stderr.strip() == f"error: qrels file not found: {tmp_path / 'none.tsv'}"
    (tmp_path / "other.tsv").write_text("zz\tf1\t1\n")
    unknown = medfaq("eval", "retrieval", *args, "--qrels", tmp_path / "other.tsv")
    assert unknown.exit_code == 2 and "not in" in unknown.stderr and len(unknown.stderr.strip().splitlines()) == 1
    both = medfaq("eval", "retrieval", *args, "--qrels", bench_dir / "qrels.tsv", "--compare", "--run-out", "x")
    assert both.exit_code == 2 and "leave out --compare" in both.stderr
    bad = medfaq("eval", "retrieval", *args, "--qrels", bench_dir / "qrels.tsv", "--query", "sideways")
    assert bad.exit_code == 2 and "'--query': unknown query source 'sideways'" in bad.stderr
    (tmp_path / "sums.jsonl").write_text('{"text": "How is shingles treated?"}\n')
    no_summary = medfaq("eval", "retrieval", *args, "--qrels", bench_dir / "qrels.tsv", "--compare", "--summaries",
                        tmp_path / "sums.jsonl")  # fmt: skip
    assert no_summary.exit_code == 2 and "has no 'summary' text" in no_summary.stderr
    too_long = medfaq("eval", "retrieval", *args, "--qrels", bench_dir / "qrels.tsv", "--min-words", "6")
    assert too_long.exit_code == 2 and "no judged question has 6 words" in too_long.stderr


def test_eval_retrieval_reports_real_banks_first_and_the_listed_questions_apart(bench_dir, tmp_path):
    import shutil

    for name in ("meqsum", "quebec"):  # the tiny benchmark under the names of a summary-matching set and a real bank
        shutil.copytree(bench_dir, tmp_path / name)
        info = json.loads((tmp_path / name / "benchmark.json").read_text())
        (tmp_path / name / "benchmark.json").write_text(json.dumps({**info, "name": name}))
    both = ["--benchmark", tmp_path / "meqsum", "--benchmark", tmp_path / "quebec", "--mode", "bm25"]
    text = medfaq("eval", "retrieval", *both)
    assert text.exit_code == 0, text.output
    out = text.stdout
    real, summary = out.index("== Real FAQ banks: the evidence for defaults =="), out.index("== Summary-matching")
    assert real < out.index("quebec: 2 judged test questions") < summary < out.index("meqsum: 2 judged")
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "quebec.txt").write_text("q1\nq3\no1\no2\n")  # q2 left out
    (clean / "meqsum.txt").write_text("q2\n")
    data = json.loads(medfaq("eval", "retrieval", *both, "--json", "--query-ids", clean).stdout)
    quebec, meqsum = data["benchmarks"]
    assert (quebec["benchmark"], quebec["kind"], meqsum["benchmark"], meqsum["kind"]) == (
        "quebec", "real-bank", "meqsum", "summary-matching"
    )  # fmt: skip
    assert (quebec["listed"], quebec["listed_judged_test"], meqsum["listed_judged_test"]) == (4, 1, 1)
    assert quebec["rows"][0]["listed"]["recall@1"] == 100.0 and "auroc" in quebec["rows"][0]["listed"]
    single = medfaq("eval", "retrieval", *bench_args(bench_dir), "--mode", "bm25", "--query-ids", clean / "quebec.txt")
    assert single.exit_code == 0 and "bm25 [listed ids]" in single.stdout and "==" not in single.stdout
    one_file = medfaq("eval", "retrieval", *both, "--query-ids", clean / "quebec.txt")
    assert one_file.exit_code == 2 and "give a directory of <benchmark>.txt" in one_file.stderr
    mixed = medfaq("eval", "retrieval", *both, "--queries", bench_dir / "queries.jsonl")
    assert mixed.exit_code == 2 and "leave out --queries/--qrels" in mixed.stderr
    run = medfaq("eval", "retrieval", *both, "--run-out", tmp_path / "run.trec")
    assert run.exit_code == 2 and "give one --benchmark" in run.stderr


def test_search_uses_pipeline_json_and_flags_override(bench_dir, monkeypatch):
    import medfaq.retriever.model_cache as model_cache

    directory = bench_dir / "index"
    write_config(directory, PipelineConfig(mode="bm25", top_k=2, entities=False))
    saved = json.loads(medfaq("search", "--index", directory, "--json", "shingles treated").stdout)
    assert len(saved["hits"]) <= 2 and set(saved["hits"][0]["stage_scores"]) == {"bm25"}
    assert {"summary", "entities", "abstained", "timings_ms", "confidence"} <= set(saved)
    dense = json.loads(medfaq("search", "--index", directory, "--json", "--mode", "dense", "shingles").stdout)
    assert set(dense["hits"][0]["stage_scores"]) == {"dense"}
    monkeypatch.setitem(model_cache._STAGE_LOADERS, "rewrite", model_cache.StageLoader(lambda name: Echo()))
    summarized = json.loads(medfaq("search", "--index", directory, "--json", "--summarize", "shingles, itchy").stdout)
    assert summarized["summary"] == "shingles" and summarized["query"] == "shingles, itchy"
    abstained = json.loads(
        medfaq("search", "--index", directory, "--json", "--mode", "dense", "--abstain", "--threshold", "2", "x").stdout
    )
    assert abstained["abstained"] is True


def test_bench_json_has_stage_percentiles(bench_dir):
    result = medfaq(
        "bench", "--index", bench_dir / "index", "--queries", "4", "--json", "--ann-vectors", "0", "--peers"
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"p50_ms", "p95_ms"} <= set(data["end_to_end"])
    assert {"p50_ms", "p95_ms"} <= set(data["stages"]["retrieve"])
    assert data["peers"]["bm25"]["ratio"] > 0 and data["peers"]["dense"]["ratio"] > 0 and data["peers"]["ann"] is None
    assert data["throughput"]["queries_per_s"] > 0 and data["peak_memory_mb"] > 0 and data["index_size_mb"] > 0
    text = medfaq("bench", "--index", bench_dir / "index", "--queries", "2", "--ann-vectors", "0", "--no-peers")
    assert text.exit_code == 0 and "end_to_end" in text.stdout and "retrieve" in text.stdout


def test_eval_retrieval_loads_the_real_stages_in_a_fresh_process(bench_dir, tmp_path):
    """The stage loaders register on import: a fresh `medfaq eval retrieval` must import them itself."""
    args = bench_args(bench_dir)
    command = [sys.executable, "-m", "medfaq.app", "eval", "retrieval", *map(str, args), "--mode", "bm25"]
    missing = tmp_path / "no-such-summarizer"
    result = subprocess.run([*command, "--summarize", "--summarizer", str(missing)], capture_output=True, text=True)
    assert result.returncode == 2 and "no rewrite stage" not in result.stderr
    assert str(missing) in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_first_hits_agree_with_pytrec_eval_where_each_question_has_one_gold():
    from medfaq.common.ranking import first_hits, ranking_metrics

    ranked = {"q1": ["a", "b", "c"], "q2": ["c", "b"], "q3": ["x", "y"], "q4": [f"d{i}" for i in range(10)] + ["g"]}
    golds = {"q1": {"a"}, "q2": {"b"}, "q3": {"z"}, "q4": {"g"}}
    run = {qid: {faq: float(len(ids) - rank) for rank, faq in enumerate(ids)} for qid, ids in ranked.items()}
    means, _ = ranking_metrics(run, {qid: {gold: 1 for gold in ids} for qid, ids in golds.items()})
    recall_at_1, mrr, firsts = first_hits(ranked, golds)
    assert firsts == {"q1"}
    assert (recall_at_1, mrr) == (means["recall@1"], means["mrr@10"]) == (25.0, 37.5)
