from __future__ import annotations

import io
import json

import pytest
from typer.testing import CliRunner

from medfaq.app import cmd_eval
from medfaq.app.cli import app
from medfaq.eval.summarization import (
    SummarizationEvaluator,
    entity_consistency,
    focus_identification_rate,
    rouge_scores,
)
from medfaq.summarizer.entities import DictionaryRecognizer
from medfaq.summarizer.generation import consensus

TERMS = {"aspirin": "drug", "migraine": "disease", "flu": "disease", "asthma": "disease", "ibuprofen": "drug"}


def test_rouge_identical_is_100_and_matches_hand_counts():
    assert rouge_scores(["What treats a migraine?"], ["What treats a migraine?"]) == pytest.approx(
        {"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0}
    )
    # unigrams: 2 of 3 shared (P = R = 2/3); bigrams: "the cat" of 2 (1/2); LCS "the cat" = 2 of 3
    scores = rouge_scores(["the cat sat"], ["the cat ran"])
    assert scores == pytest.approx({"rouge1": 200 / 3, "rouge2": 50.0, "rougeL": 200 / 3})
    assert rouge_scores(["treatments"], ["treatment"])["rouge1"] == pytest.approx(100.0)  # stemmed
    assert rouge_scores(["", "the cat sat"], ["x", "the cat sat"])["rouge1"] == pytest.approx(50.0)  # mean


def test_focus_rate_and_entity_consistency_by_hand():
    rate, counted = focus_identification_rate(
        ["Does aspirin help?", "Is it contagious?", "Anything"], [{"aspirin"}, {"flu"}, set()]
    )
    assert (rate, counted) == (50.0, 2)  # the sample without focus is left out
    assert focus_identification_rate(["influence of aspirinate"], [{"flu"}])[0] == 0.0  # whole words only
    assert entity_consistency([{"aspirin", "migraine"}], [{"aspirin", "flu"}]) == 50.0
    assert entity_consistency([set()], [{"flu"}]) == 0.0


def test_evaluator_on_a_constructed_pair():
    recognizer = DictionaryRecognizer(TERMS)
    chqs = ["My head hurts. Can aspirin stop a migraine attack?", "I sneeze all day, is this the flu or a cold?"]
    references = ["Can Aspirin treat a migraine?", "How do I know if I have the flu?"]
    stream = io.StringIO()
    evaluator = SummarizationEvaluator(chqs, references, recognizer=recognizer, name="tiny", stream=stream)
    metrics = evaluator(["Does aspirin cure the flu?", "What are the symptoms of asthma?"])
    # E(ref) = {aspirin, migraine}, {flu}; E(gen) = {aspirin, flu}, {asthma} -> 1 of 3 kept
    assert metrics["entity_consistency"] == pytest.approx(100 / 3)
    assert metrics["fir"] == metrics["fir_entity"] == 50.0 and metrics["fir_entity_n"] == 2
    # overlap focus: {aspirin, migraine} and {flu}; only the first generated question names one
    assert metrics["fir_overlap"] == 50.0 and metrics["fir_overlap_n"] == 2
    assert "tiny (2 samples)" in stream.getvalue() and "entity_consistency" in stream.getvalue()
    assert metrics["distinct_outputs"] == 2 and evaluator(["What is it?", "what is  it?"])["distinct_outputs"] == 1
    perfect = evaluator(references)
    assert all(perfect[key] == pytest.approx(100.0) for key in ("rouge1", "rouge2", "rougeL", "fir_overlap"))
    with pytest.raises(ValueError):
        evaluator(["only one"])


class FakeSummarizer:
    """Stands in for summarizer.generation.Summarizer: 'summarizes' a CHQ into its first sentence."""

    loaded: list = []
    decoding: list = []

    @classmethod
    def load(cls, model, device=None, quantize=False, int8_backend="auto"):
        cls.loaded.append(str(model))
        return cls()

    def candidates(self, texts, decoding, batch_size=16):
        """The first sentence as the best beam; below it an outlier, then a near copy of the first sentence."""
        self.decoding.append((decoding.guidance, decoding.length_penalty))
        return [
            [f"{first}?", "Why?", f"{first} today?"][: decoding.mbr] for first in (text.split(".")[0] for text in texts)
        ]


@pytest.fixture
def meqsum_root(tmp_path):
    root = tmp_path / "data"
    (root / "meqsum").mkdir(parents=True)
    rows = [
        {"id": 1, "chq": "Can aspirin stop a migraine. I get them weekly", "faq": "Can aspirin stop a migraine?"},
        {"id": 2, "chq": "Is flu contagious. My son has it", "faq": "How long is the flu contagious?"},
        {"id": 3, "chq": "What is asthma. Doctor said so", "faq": "What is asthma?"},
    ]
    (root / "meqsum" / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


def test_eval_summarizer_cli_json_and_predictions(tmp_path, meqsum_root, monkeypatch):
    monkeypatch.setattr(cmd_eval, "_summarizer_class", lambda: FakeSummarizer)
    model = tmp_path / "model"
    model.mkdir()
    predictions = tmp_path / "pred.jsonl"
    args = ["eval", "summarizer", "--model", str(model), "--data", "meqsum:test", "--data-root", str(meqsum_root)]
    result = CliRunner().invoke(
        app, [*args, "--json", "--output", str(predictions), "--limit", "2", "--ner", "dictionary"]
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)  # one JSON object and nothing else on stdout
    assert {"rouge1", "rouge2", "rougeL", "fir", "entity_consistency"} <= set(metrics) and metrics["n"] == 2
    assert metrics["rouge1"] == pytest.approx(
        rouge_scores(
            ["Can aspirin stop a migraine?", "Is flu contagious?"],
            ["Can aspirin stop a migraine?", "How long is the flu contagious?"],
        )["rouge1"]
    )
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert [set(row) for row in rows] == [{"id", "chq", "reference", "prediction"}] * 2
    assert rows[0]["prediction"] == "Can aspirin stop a migraine?" and rows[1]["id"] == "meqsum:test:2"

    table = CliRunner().invoke(app, [*args, "--output", str(predictions), "--ner", "dictionary"])
    assert table.exit_code == 0 and "rougeL" in table.stdout and "questions/s" in table.stdout

    mbr = CliRunner().invoke(app, [*args, "--json", "--output", str(predictions), "--ner", "dictionary", "--mbr", "3"])
    assert mbr.exit_code == 0, mbr.output
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert rows[2]["candidates"] == ["What is asthma?", "Why?", "What is asthma today?"]
    assert all(row["prediction"] == consensus(row["candidates"]) for row in rows)

    guided = CliRunner().invoke(app, [*args, "--output", str(predictions), "--ner", "dictionary", "--guidance", "0.1"])
    assert guided.exit_code == 0 and FakeSummarizer.decoding[-2:] == [(0.0, 1.0), (0.1, 1.0)]  # after --mbr: off
    longer = CliRunner().invoke(
        app, [*args, "--json", "--output", str(predictions), "--ner", "dictionary", "--length-penalty", "1.5"]
    )
    assert longer.exit_code == 0 and FakeSummarizer.decoding[-1] == (0.0, 1.5)
    decoding = {"num_beams": 3, "max_length": 64, "length_penalty": 1.5, "guidance": 0.0, "mbr": 1}
    decoding |= {"sample": False, "top_p": 0.9, "temperature": 1.0}  # search, not sampling
    assert json.loads(longer.stdout)["decoding"] == decoding
    for option in ("--length-penalty", "--guidance"):
        endless = CliRunner().invoke(app, [*args, "--output", str(predictions), option, "inf"])
        assert endless.exit_code == 2 and "inf is not a finite number" in endless.output
    int8 = CliRunner().invoke(app, [*args, "--output", str(predictions), "--guidance", "0.1", "--quantize"])
    assert int8.exit_code == 2 and int8.output.strip() == "error: --guidance runs on the fp32 model; drop --quantize"


def test_consensus_picks_the_candidate_the_others_agree_with():
    assert consensus(["Why?", "What is asthma?", "What causes asthma?"]) == "What is asthma?"
    assert consensus(["what treats asthma", "what is asthma", "what is asthma", "how"]) == "what is asthma"
    assert consensus(["a b", "c d", "e f"]) == "a b"  # no agreement at all: the best-ranked beam
    assert consensus(["only two", "candidates here"]) == "only two"


def test_eval_summarizer_cli_errors(tmp_path, meqsum_root):
    runner = CliRunner()
    missing = runner.invoke(
        app, ["eval", "summarizer", "--model", str(tmp_path / "nope"), "--data-root", str(meqsum_root)]
    )
    unknown = runner.invoke(app, ["eval", "summarizer", "--model", "x", "--data", "icliniq:test"])
    for result, text in ((missing, "not a local directory"), (unknown, "unknown summarization dataset 'icliniq'")):
        assert result.exit_code == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0]


def test_eval_summarizer_with_a_tiny_real_summarizer(tmp_path, meqsum_root, tiny_bert_dir):
    """End to end with `summarizer.generation.Summarizer` on a tiny random encoder-decoder saved like a trained one."""
    from medfaq.summarizer.generation import CONFIG_FILE
    from medfaq.summarizer.modeling import load_backbone

    model, tokenizer = load_backbone(tiny_bert_dir)
    model_dir = tmp_path / "tiny-summarizer"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (model_dir / CONFIG_FILE).write_text("{}")
    predictions = tmp_path / "pred.jsonl"
    args = ["eval", "summarizer", "--model", str(model_dir), "--data-root", str(meqsum_root), "--json"]
    options = ["--output", str(predictions), "--num-beams", "2", "--max-length", "6", "--ner", "dictionary"]
    result = CliRunner().invoke(app, [*args, *options, "--device", "cpu"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)
    assert metrics["n"] == 3 and 0.0 <= metrics["rougeL"] <= 100.0
    assert len(predictions.read_text().splitlines()) == 3


def _write_predictions(path, predictions, references=("the cat ran", "is flu contagious", "aspirin dose")):
    lines = [
        json.dumps({"id": str(number), "chq": "", "reference": reference, "prediction": prediction})
        for number, (reference, prediction) in enumerate(zip(references, predictions))
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_paired_summaries_average_each_side_over_its_files_and_count_wins(tmp_path):
    from experiments.paired_summaries import compare, main

    # per question ROUGE-1 of side A: file 1 (200/3, 100, 0) and file 2 (200/3, 0, 0) -> mean (200/3, 50, 0)
    a1 = _write_predictions(tmp_path / "a1.jsonl", ["the cat sat", "is flu contagious", "nothing"])
    a2 = _write_predictions(tmp_path / "a2.jsonl", ["the cat sat", "nothing", "nothing"])
    b = _write_predictions(tmp_path / "b.jsonl", ["the cat ran", "nothing", "nothing"])  # (100, 0, 0)
    result = compare([a1, a2], [b], resamples=2000, seed=3)
    assert result["a_mean"] == pytest.approx((200 / 3 + 50) / 3) and result["b_mean"] == pytest.approx(100 / 3)
    assert result["difference"] == pytest.approx((200 / 3 - 100 + 50) / 3)
    assert result["low"] <= result["difference"] <= result["high"]
    assert (result["better"], result["worse"], result["level"], result["questions"]) == (1, 1, 1, 3)
    assert compare([a1, a2], [b], resamples=2000, seed=3) == result  # seeded
    identical = compare([b], [b], resamples=100)
    assert (identical["difference"], identical["low"], identical["high"], identical["level"]) == (0, 0, 0, 3)
    main(["--a", str(a1), "--b", str(b), "--resamples", "100"])


def test_paired_summaries_refuse_files_of_other_questions_with_one_line(tmp_path, capsys):
    from experiments.paired_summaries import main

    a = _write_predictions(tmp_path / "a.jsonl", ["x", "y", "z"])
    other = _write_predictions(tmp_path / "other.jsonl", ["x", "y", "z"], references=("a", "b", "c"))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": 1}\n', encoding="utf-8")
    for args, message in [
        (["--a", str(a), str(other), "--b", str(a)], "does not hold the questions and references of the first A"),
        (["--a", str(a), "--b", str(other)], "other.jsonl does not hold the questions and references of the first A"),
        (["--a", str(a), "--b", str(broken)], "broken.jsonl:1: not a predictions line"),
        (["--a", str(a), "--b", str(tmp_path / "missing.jsonl")], "cannot read"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith("error: ") and message in error and "\n" not in error
