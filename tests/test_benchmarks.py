"""Benchmarks made from ../shared/data are valid BEIR directories with consistent ids and splits."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from medfaq.app.cli import app
from medfaq.common.runtime import MedfaqError
from medfaq.eval.benchmarks import (
    BENCHMARKS,
    OVER_BANK,
    Benchmark,
    by_kind,
    dev_or_test,
    make_benchmark,
    read_beir_queries,
    read_qrels,
)
from medfaq.index.collections import load_collection
from medfaq.index.datasets import BenchmarkSpec
from tests.conftest import ACHALASIA_CHQ, GOUT_CHQ, SHINGLES_CHQ


@pytest.mark.parametrize("name", [name for name in BENCHMARKS if name not in OVER_BANK])
def test_benchmark_files_are_beir(name, shared_data, tmp_path):
    benchmark = make_benchmark(name, shared_data)
    out = benchmark.save(tmp_path / name)
    corpus = [json.loads(line) for line in (out / "corpus.jsonl").read_text().splitlines()]
    queries = read_beir_queries(out / "queries.jsonl")
    qrels = read_qrels(out / "qrels.tsv")
    beir = {"_id", "title", "text", "metadata"}
    assert all(set(row) == {*beir, "answer"} and row["text"] for row in corpus)  # BEIR's fields, and an FAQ's answer
    answered = sum(bool(row.get("answer")) for row in corpus)
    assert answered > 0 if name in ("quebec", "covid-q") else answered == 0  # COVID-Q: 245 of 574 have one
    assert all(set(row) == {"_id", "text", "metadata"} for row in queries)
    corpus_ids = {row["_id"] for row in corpus}
    query_ids = {row["_id"] for row in queries}
    assert len(corpus_ids) == len(corpus) and len(query_ids) == len(queries)
    assert set(qrels) <= query_ids and all(set(docs) <= corpus_ids for docs in qrels.values())
    assert read_qrels(out / "qrels.trec") == qrels
    ood = set((out / "ood.txt").read_text().split())
    assert ood == benchmark.ood_ids and not ood & set(qrels)
    assert set(qrels) | ood == query_ids  # every query is judged or out of scope
    assert len({" ".join(row["text"].lower().split()) for row in corpus}) == len(corpus)  # no duplicate FAQs
    assert make_benchmark(name, shared_data).queries == benchmark.queries  # deterministic
    loaded = Benchmark.load(out)
    assert loaded.qrels == qrels and loaded.ood_ids == ood and loaded.dev_ids == benchmark.dev_ids
    records, _ = load_collection(out / "corpus.jsonl", "jsonl", {"id": "_id", "question": "text"})
    assert len(records) == len(corpus)


def test_quebec_has_dev_test_and_out_of_scope_queries(shared_data):
    from medfaq.retriever.training.pair_data import quebec_query_split

    benchmark = make_benchmark("quebec", shared_data)
    assert len(benchmark.corpus) == 313
    test_ids = {q["_id"] for q in benchmark.queries} - benchmark.dev_ids
    assert benchmark.ood_ids & benchmark.dev_ids and benchmark.ood_ids & test_ids
    assert set(benchmark.qrels) & benchmark.dev_ids and set(benchmark.qrels) & test_ids
    train, _ = quebec_query_split(seed=0, data_root=shared_data)
    train_texts = {" ".join(row["question"].lower().split()) for row in train}
    assert not any(" ".join(q["text"].lower().split()) in train_texts for q in benchmark.queries)


def test_make_benchmark_cli(shared_data, tmp_path):
    runner = CliRunner()
    out = tmp_path / "mediqa"
    result = runner.invoke(
        app, ["data", "make-benchmark", "mediqa2021", "--out", str(out), "--from", str(shared_data), "--no-index"]
    )
    assert result.exit_code == 0, result.output
    assert "100 queries" in result.stdout and (out / "qrels.tsv").is_file() and not (out / "index").exists()
    bad = runner.invoke(app, ["data", "make-benchmark", "nope", "--out", str(out), "--no-index"])
    assert bad.exit_code == 2 and bad.stderr.strip().startswith("error: unknown benchmark 'nope'")
    with pytest.raises(MedfaqError, match="not a benchmark directory"):
        Benchmark.load(tmp_path)


def _part(name, faqs, queries, qrels):
    corpus = [{"_id": doc_id, "title": "", "text": text, "metadata": {}} for doc_id, text in faqs.items()]
    rows = [{"_id": q, "text": text, "metadata": {"split": "test", "ood": False}} for q, text in queries.items()]
    return Benchmark(name, corpus, rows, qrels)


def test_distractor_benchmark_adds_gold_faqs_to_the_bank_once():
    from medfaq.eval.benchmarks import with_distractors
    from medfaq.index.records import FaqRecord

    bank = [FaqRecord("m1", "What is shingles?"), FaqRecord("m2", "How is  GOUT treated?"), FaqRecord("m3", "x?")]
    first = _part(
        "a",
        {"faq-0": "How is gout treated?", "faq-1": "Is flu contagious?", "faq-2": "unused distractor?"},
        {"q-0": "My toe hurts since Monday, my doctor says gout. What now?", "q-1": "Flu at work?"},
        {"q-0": {"faq-0": 1}, "q-1": {"faq-1": 1}},
    )
    second = _part(
        "b", {"faq-0": "Is flu contagious?"}, {"q-0": "Sneezing colleague", "q-9": "no gold"}, {"q-0": {"faq-0": 1}}
    )
    benchmark = with_distractors("mix", [first, second], bank)
    ids = [row["_id"] for row in benchmark.corpus]
    assert ids[:3] == ["m1", "m2", "m3"] and ids[3:] == ["a:faq-1"]  # gout is already in the bank; flu added once
    assert benchmark.qrels == {"a:q-0": {"m2": 1}, "a:q-1": {"a:faq-1": 1}, "b:q-0": {"a:faq-1": 1}}
    assert [q["_id"] for q in benchmark.queries] == ["a:q-0", "a:q-1", "b:q-0"]  # unjudged queries are left out
    assert benchmark.queries[0]["metadata"]["part"] == "a" and benchmark.queries[0]["metadata"]["words"] == 11
    assert benchmark.info == {"bank_size": 3, "added_gold": 1}


def test_medquad_chq_reuses_the_bank_index(shared_data, tmp_path, tiny_encoder):
    from medfaq.eval.benchmarks import index_over_bank
    from medfaq.index.faq_index import FaqIndex
    from medfaq.index.records import FaqRecord

    bank = [FaqRecord(f"medquad-{i}", f"What are the symptoms of condition {i}?") for i in range(5)]
    FaqIndex.build(bank, tiny_encoder, progress=False).save(tmp_path / "bank")
    with pytest.raises(MedfaqError, match="needs the MedQuAD index"):
        make_benchmark("medquad-chq", shared_data)
    benchmark = make_benchmark("medquad-chq", shared_data, bank)
    assert {q["metadata"]["part"] for q in benchmark.queries} == {"meqsum", "rqe-test", "mediqa2021"}
    added = index_over_bank(benchmark, tmp_path / "index", tmp_path / "bank")
    index = FaqIndex.load(tmp_path / "index", tiny_encoder)
    assert added == len(benchmark.corpus) - 5 and len(index) == len(benchmark.corpus)
    assert all(doc in index for docs in benchmark.qrels.values() for doc in docs)


def test_covid_q_is_a_bank_of_class_questions_searched_by_the_others(shared_data):
    benchmark = make_benchmark("covid-q", shared_data)
    assert len(benchmark.corpus) == 574  # 575 classes, two of whose first questions differ only in case
    assert len(benchmark.queries) > 1000
    faq_texts = {row["text"].lower() for row in benchmark.corpus}
    assert not any(query["text"].lower() in faq_texts for query in benchmark.queries)
    assert all(len(gold) >= 1 for gold in benchmark.qrels.values())
    dev = benchmark.dev_ids  # halved by a hash of the text, so the same on every machine and every run
    assert 0.4 < len(dev) / len(benchmark.queries) < 0.6 and dev == make_benchmark("covid-q", shared_data).dev_ids


def test_split_benchmark_writes_seeded_disjoint_parts_with_training_pairs(shared_data, tmp_path):
    from medfaq.eval.summarization_data import load_pairs

    runner = CliRunner()
    bench = tmp_path / "mediqa"
    made = ["data", "make-benchmark", "mediqa2021", "--out", str(bench), "--from", str(shared_data), "--no-index"]
    assert runner.invoke(app, made).exit_code == 0
    result = runner.invoke(app, ["data", "split-benchmark", str(bench), "--seed", "3"])
    assert result.exit_code == 0, result.output
    parts = {name: read_beir_queries(bench / "split-3" / name / "queries.jsonl") for name in ("train", "dev", "test")}
    ids = [{q["_id"] for q in queries} for queries in parts.values()]
    assert sum(map(len, ids)) == 100 and not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert 40 <= len(ids[0]) <= 80 and all(q["metadata"]["part"] == "dev" for q in parts["dev"])
    assert all(q["metadata"]["split"] == "test" for q in parts["dev"])  # scored as test questions of their part
    again = tmp_path / "again"
    runner.invoke(app, ["data", "split-benchmark", str(bench), "--seed", "3", "--out", str(again)])
    assert (again / "test" / "qrels.tsv").read_text() == (bench / "split-3" / "test" / "qrels.tsv").read_text()
    pairs = load_pairs(f"{bench / 'split-3' / 'train' / 'pairs.jsonl'}+mediqa2021:valid", shared_data)
    corpus = {row["_id"]: row["text"] for row in Benchmark.load(bench).corpus}
    qrels = read_qrels(bench / "split-3" / "train" / "qrels.tsv")
    first = parts["train"][0]
    assert (pairs[0].chq, pairs[0].faq) == (first["text"], corpus[next(iter(qrels[first["_id"]]))])
    assert len(pairs) == len(ids[0]) + 50 and pairs[-1].source == "mediqa2021:valid"
    bad = runner.invoke(app, ["data", "split-benchmark", str(bench), "--fractions", "0.5,0.5"])
    assert bad.exit_code != 0 and "three positive fractions" in bad.output


def test_every_benchmark_declares_its_kind_and_real_banks_come_first():
    kinds = {name: spec.kind for name, (_, spec) in BENCHMARKS.items()}
    assert {name for name, kind in kinds.items() if kind == "real-bank"} == {"covid-q", "quebec", "medquad-rqe"}
    assert {name for name, kind in kinds.items() if kind == "summary-matching"} == {
        "meqsum", "mediqa2021", "rqe-valid", "rqe-test", "medquad-chq"
    }  # fmt: skip
    assert by_kind(["meqsum", "own", "covid-q", "rqe-test", "quebec"]) == [
        ("real-bank", ["covid-q", "quebec"]),
        ("summary-matching", ["meqsum", "rqe-test"]),
        ("", ["own"]),
    ]
    with pytest.raises(ValueError, match="kind '' is not one of real-bank, summary-matching"):
        BenchmarkSpec("undeclared")


def test_medquad_rqe_asks_rqe_questions_whose_entailed_faq_is_a_medquad_question(fake_data, tmp_path, tiny_encoder):
    from medfaq.index.faq_index import FaqIndex

    benchmark = make_benchmark("medquad-rqe", fake_data)
    assert [row["_id"] for row in benchmark.corpus] == ["m1", "m2", "m3", "m4", "m5", "m6"]  # all of it, nothing added
    texts = {query["_id"]: query["text"] for query in benchmark.queries}
    assert texts == {"q-test-1": GOUT_CHQ, "q-test-5": SHINGLES_CHQ, "q-valid-1": ACHALASIA_CHQ}
    # "what is  gout" is two records; an entailed FAQ MedQuAD lacks and a pair labelled 0 judge nothing
    assert benchmark.qrels == {"q-test-1": {"m1": 1, "m2": 1, "m3": 1}, "q-test-5": {"m4": 1}, "q-valid-1": {"m5": 1}}
    assert all(query["metadata"]["split"] == dev_or_test(query["text"]) for query in benchmark.queries)
    assert benchmark.dev_ids == {q for q, text in texts.items() if dev_or_test(text) == "dev"}
    runner = CliRunner()
    made = ["data", "make-benchmark", "medquad-rqe", "--from", str(fake_data)]
    assert runner.invoke(app, [*made, "--out", str(tmp_path / "files"), "--no-index"]).exit_code == 0  # no bank needed
    missing = runner.invoke(app, [*made, "--out", str(tmp_path / "b0"), "--bank", str(tmp_path / "none")])
    assert missing.exit_code == 2 and "no MedQuAD index at" in missing.stderr
    records, _ = load_collection(fake_data / "medquad" / "medquad.jsonl", format="medquad")
    FaqIndex.build(records, tiny_encoder, progress=False).save(tmp_path / "bank")
    result = runner.invoke(app, [*made, "--out", str(tmp_path / "b1"), "--bank", str(tmp_path / "bank")])
    assert result.exit_code == 0, result.output
    assert "added 0 FAQs" in result.stdout and len(FaqIndex.load(tmp_path / "b1" / "index", tiny_encoder)) == 6
    FaqIndex.build(records[:5], tiny_encoder, progress=False).save(tmp_path / "part")
    other = runner.invoke(app, [*made, "--out", str(tmp_path / "b2"), "--bank", str(tmp_path / "part")])
    assert other.exit_code == 2 and "lacks 1 of medquad-rqe's 6 FAQs (e.g. 'm6')" in other.stderr


@pytest.mark.integration
def test_medquad_rqe_on_the_real_data(shared_data):
    benchmark = make_benchmark("medquad-rqe", shared_data)
    assert len(benchmark.corpus) == 47441 and len(benchmark.queries) == len(benchmark.qrels) == 48
    by_split = [query["metadata"]["rqe_split"] for query in benchmark.queries]
    assert by_split.count("test") == 45 and by_split.count("valid") == 3
    assert len(benchmark.dev_ids) == 24
    corpus_ids = {row["_id"] for row in benchmark.corpus}
    assert all(set(docs) <= corpus_ids for docs in benchmark.qrels.values())
