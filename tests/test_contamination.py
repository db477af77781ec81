"""The contamination audit: planted exact copies and near-duplicates of benchmark questions in training sources are
found and named by source, the shingle index finds what comparing every pair finds, and `medfaq data audit` reports
real FAQ banks first and writes the clean question ids."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from typer.testing import CliRunner

from medfaq.app.cli import app
from medfaq.common.runtime import MedfaqError
from medfaq.eval.benchmarks import make_benchmark
from medfaq.eval.contamination import RANK_SOURCE, ShingleIndex, audit_benchmarks, jaccard, shingles
from medfaq.retriever.training.pair_data import hashed_position
from tests.conftest import ACHALASIA_CHQ, COVID_MQP_QUESTION, GOUT_CHQ, SHINGLES_CHQ

NOT_RANK = ["meqsum:train", "healthcaremagic:valid", "mqp:train", "quebec:train", "medquad:train"]


def ids_of(benchmark_name, fake_data) -> dict[str, str]:
    """Question text -> its id in the benchmark."""
    return {q["text"]: q["_id"] for q in make_benchmark(benchmark_name, fake_data).queries}


def test_planted_copies_are_found_exactly_or_as_near_duplicates_with_their_source(fake_data):
    audits = audit_benchmarks(["meqsum", "covid-q", "medquad-rqe"], fake_data, sources=NOT_RANK)
    assert [bench.name for bench in audits] == ["covid-q", "medquad-rqe", "meqsum"]  # real FAQ banks first
    covid, rqe, meqsum = audits
    found = {(o.query_id, o.source): o for o in rqe.overlaps}
    ids = ids_of("medquad-rqe", fake_data)
    shingles_copy = found.pop((ids[SHINGLES_CHQ], "meqsum:train"))
    assert shingles_copy.match == "exact" and shingles_copy.similarity == 1.0  # case, spaces, final punctuation
    achalasia = found.pop((ids[ACHALASIA_CHQ], "healthcaremagic:valid"))
    assert achalasia.match == "near" and 0.9 <= achalasia.similarity < 1.0 and "swalowing" in achalasia.training_text
    assert not found  # GOUT_CHQ is in no source
    assert rqe.clean_ids() == [ids[GOUT_CHQ]]
    splits = rqe.split_counts()
    assert sum(row["questions"] for row in splits.values()) == 3
    assert sum(row["exact"] for row in splits.values()) == 1 and sum(row["near"] for row in splits.values()) == 1
    by_source = {"healthcaremagic:valid": {"exact": 0, "near": 1}, "meqsum:train": {"exact": 1, "near": 0}}
    assert rqe.source_counts() == by_source
    assert [(o.source, o.match, o.question) for o in covid.overlaps] == [("mqp:train", "exact", COVID_MQP_QUESTION)]
    assert meqsum.overlaps == [] and covid.kind == "real-bank" and meqsum.kind == "summary-matching"


def test_the_rank_summarizers_training_part_of_medquad_chq_is_a_source(fake_data):
    (rqe,) = audit_benchmarks(["medquad-rqe"], fake_data, sources=[RANK_SOURCE])
    rqe_test_questions = [GOUT_CHQ, SHINGLES_CHQ]  # medquad-chq asks RQE test's questions, not valid's
    expected = {ids_of("medquad-rqe", fake_data)[t] for t in rqe_test_questions if hashed_position(t, 0) < 0.6}
    assert {o.query_id for o in rqe.overlaps} == expected
    assert all(o.match == "exact" for o in rqe.overlaps)


def test_unknown_benchmark_or_source_is_an_error(fake_data):
    with pytest.raises(MedfaqError, match="unknown benchmark 'nope'"):
        audit_benchmarks(["nope"], fake_data)
    with pytest.raises(MedfaqError, match="unknown training source 'meqsum:test'"):
        audit_benchmarks(["covid-q"], fake_data, sources=["meqsum:test"])


def test_the_shingle_index_finds_every_pair_comparing_all_pairs_finds():
    rng = random.Random(0)
    words = ["gout", "pain", "toe", "night", "my", "is", "what", "help", "the", "and"]
    base = [" ".join(rng.choices(words, k=rng.randint(1, 12))) for _ in range(60)]
    texts = base + [text[: rng.randint(0, len(text))] + "x" + text[len(text) // 2 :] for text in base[:30]]
    for threshold in (0.5, 0.9):
        index = ShingleIndex(texts, threshold)
        for query in texts[:40]:
            expected = {i for i, text in enumerate(texts) if jaccard(shingles(query), shingles(text)) >= threshold}
            assert {i for i, _ in index.search(query)} == expected, (query, threshold)
    assert any(len(ShingleIndex(texts, 0.5).search(query)) > 1 for query in texts)  # not only the text itself
    assert shingles("abc") == shingles("ABC ?")  # a text shorter than a shingle is one
    with pytest.raises(MedfaqError, match="threshold"):
        ShingleIndex(texts, 0.0)
    assert all(jaccard(shingles(a), shingles(b)) < 1 for a, b in itertools.combinations(["gout", "pout", "gou"], 2))


def test_audit_command_reports_real_banks_first_and_writes_clean_ids(fake_data, tmp_path):
    runner = CliRunner()
    base = [
        "data",
        "audit",
        "meqsum",
        "medquad-rqe",
        "covid-q",
        "--from",
        str(fake_data),
        "--sources",
        ",".join(NOT_RANK),
    ]
    text = runner.invoke(app, base)
    assert text.exit_code == 0, text.output
    real, summary = text.stdout.index("== Real FAQ banks"), text.stdout.index("== Summary-matching sets")
    assert real < text.stdout.index("medquad-rqe") < text.stdout.index("covid-q") < summary
    assert "meqsum:train" in text.stdout and "no training source holds any of its questions" in text.stdout
    result = runner.invoke(app, [*base, "--json", "--clean-ids", str(tmp_path / "clean")])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert [b["name"] for b in payload["benchmarks"]] == ["medquad-rqe", "covid-q", "meqsum"]
    assert payload["near"] == 0.9 and payload["benchmarks"][0]["kind"] == "real-bank"
    clean = (tmp_path / "clean" / "medquad-rqe.txt").read_text().split()
    assert clean == [ids_of("medquad-rqe", fake_data)[GOUT_CHQ]]
    covid = set((tmp_path / "clean" / "covid-q.txt").read_text().split())
    assert ids_of("covid-q", fake_data)[COVID_MQP_QUESTION] not in covid and len(covid) == 2
    bad = runner.invoke(app, ["data", "audit", "--from", str(fake_data), "--sources", "nope:train"])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: unknown training source 'nope:train'")
