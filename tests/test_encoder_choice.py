"""The default encoder's rule picks by the numbers it is given, and its measurements run end to end."""

from __future__ import annotations

import json

import pytest

from experiments import encoder_choice
from experiments.encoder_choice import Candidate, EncoderRule, choose
from medfaq.common.runtime import MedfaqError


def test_the_rule_keeps_the_speed_bounds_then_takes_the_best_quality():
    fast = Candidate("minilm", "onnx", 80.0, 12.0, 0.6)
    strong = Candidate("mpnet", "onnx-int8", 84.0, 150.0, 1.1)
    slow = Candidate("mpnet", "onnx", 85.0, 320.0, 1.2)
    cold = Candidate("big", "torch", 90.0, 100.0, 4.0)
    chosen, reasons = choose([fast, strong, slow, cold])
    assert chosen is strong and reasons[strong.label] == "chosen"
    assert reasons[slow.label].startswith("long question p50 320 ms") and reasons[cold.label].startswith("cold search")
    assert reasons[fast.label] == "dev R@1 80.0 < 84.0"
    assert choose([fast, strong, slow], EncoderRule(max_long_p50_ms=400))[0] is slow  # other bounds, other choice


def test_near_equal_quality_goes_to_the_faster_and_no_eligible_candidate_is_an_error():
    a, b = Candidate("a", "onnx", 84.0, 90.0, 0.5), Candidate("b", "onnx", 84.4, 150.0, 0.5)
    chosen, reasons = choose([a, b])
    assert chosen is a and reasons["b:onnx"].startswith("as good")
    with pytest.raises(MedfaqError, match="no candidate meets the speed bounds"):
        choose([Candidate("c", "torch", 90.0, 500.0, 3.0)])


def test_measure_and_the_command_run_on_a_tiny_encoder(tmp_path, tiny_encoder_dir, monkeypatch, capsys):
    from medfaq.eval.benchmarks import Benchmark

    corpus = [
        {"_id": f"d{i}", "title": "", "text": t, "metadata": {}}
        for i, t in enumerate(["What is asthma?", "Is shingles contagious?"])
    ]
    queries = [{"_id": "q0", "text": "What is asthma?", "metadata": {"split": "dev"}}]
    Benchmark("tiny", corpus, queries, {"q0": {"d0": 1}}).save(tmp_path / "bench")
    monkeypatch.setattr(encoder_choice, "COLD_RUNS", 1)
    monkeypatch.setattr(encoder_choice, "long_questions", lambda data_root: ["my chest feels tight " * 20] * 3)
    args = [
        "--candidate",
        f"{tiny_encoder_dir}:onnx",
        "--dev",
        str(tmp_path / "bench"),
        "--out",
        str(tmp_path / "r.json"),
        "--max-cold-search-s",  # a loaded test machine; the rule's own bound is 1.5
        "60",
        "--rounds",
        "2",
    ]
    assert encoder_choice.main([*args, "--candidate", f"{tmp_path / 'missing'}:onnx"]) == 0
    out = capsys.readouterr().out
    assert "| chosen |" in out and '"chosen"' in (tmp_path / "r.json").read_text()
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["rounds"] == 2 and len(report["candidates"][0]["long_p50_rounds"]) == 2
    assert f"not measured: {tmp_path / 'missing'}:onnx" in out  # a candidate that fails is reported, not chosen
    assert encoder_choice.main(["--candidate", "nobackend", "--dev", str(tmp_path / "bench")]) == 2


def test_the_rule_reads_the_median_of_the_rounds():
    candidate = Candidate("mpnet", "onnx", 80.0)
    for long_ms, cold in [(98.0, [0.9, 0.8]), (271.0, [2.3, 2.2]), (150.0, [1.2, 1.4])]:
        candidate.add_round(long_ms, cold)
    assert candidate.long_p50_ms == 150.0 and candidate.long_p50_rounds == [98.0, 271.0, 150.0]
    assert candidate.cold_search_s == pytest.approx(1.3) and len(candidate.cold_search_runs) == 6
    assert choose([candidate])[0] is candidate  # one slow round does not decide


def test_auto_without_set_up_applies_the_rule_to_the_stock_encoders_measurements():
    """Stock MPNet leads the development R@1 within the speed bounds; the first-run index's build bound keeps the
    demo's first MedQuAD index on MiniLM (MPNet's whole build measured at 11.5 min against the 10-minute bound)."""
    from medfaq.retriever.decisions.encoder_rule import stock_encoder, stock_record

    assert {row["model"] for row in stock_record()["candidates"]} == {"minilm", "mpnet"}
    assert stock_encoder() == "mpnet" and stock_encoder(first_run=True) == "minilm"
    slow = Candidate("mpnet", "onnx", 80.0, long_p50_ms=101, cold_search_s=1.1, build_minutes=11.5)
    fast = Candidate("minilm", "onnx", 70.0, long_p50_ms=15, cold_search_s=0.6, build_minutes=4.7)
    chosen, reasons = choose([slow, fast], EncoderRule(max_build_minutes=10))
    assert chosen is fast and reasons["mpnet:onnx"] == "MedQuAD build 11.5 min, bound 10"
