"""The per-index choice of the reranker (retriever/decisions/reranker_choice.py) on a tiny index: the rule turns it on
where it
wins on the development questions and the index can still abstain, off where it does not, records the decision
beside the index, and `medfaq setup` retrains the reranker when the index's encoder changes."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from medfaq.app.cli import app
from medfaq.common.runtime import MedfaqError
from medfaq.index.faq_index import FaqIndex
from medfaq.retriever.decisions.adaptation import DevQuery
from medfaq.retriever.decisions.reranker_choice import CHOICE_FILE, choose_reranker, decided_for, read_choice
from medfaq.retriever.pipeline import RERANK_MARGIN, Pipeline, PipelineConfig
from medfaq.retriever.pipeline_file import read_config, write_config
from tests.conftest import DEVELOPMENT_QUESTIONS as QUESTIONS
from tests.conftest import FAQ_ROWS, assert_decision_kept_and_shown

GOLD_QUESTIONS = {text: next(r["question"] for r in FAQ_ROWS if r["id"] == gold) for text, gold in QUESTIONS}


class KnowingReranker:
    """A cross-encoder that scores each question's gold FAQ question highest (`right`), or lowest."""

    name = "knowing-reranker"

    def __init__(self, right: bool = True) -> None:
        self.right = right

    def score(self, query: str, candidates: list[str]) -> list[float]:
        gold = GOLD_QUESTIONS[query]  # a candidate may read with its concepts' other names after it
        return [1.0 if text.startswith(gold) == self.right else 0.0 for text in candidates]


def _labelled():
    return [DevQuery(text, frozenset([gold])) for text, gold in QUESTIONS]


def _configure(directory, **changes) -> None:
    """The index's pipeline.json: the cross-encoder's order replaces the retrieval order, every question reranked
    (a gate wider than any cosine margin), as `changes` say."""
    settings = {"rerank_fusion": "replace", "rerank_margin": 2.0, "log_unanswered": False, **changes}
    write_config(directory, PipelineConfig(**settings))


def _decide(directory, right: bool = True, **options):
    options = {"progress": False, "log": lambda _: None, "stage": KnowingReranker(right), **options}
    return choose_reranker(directory, labelled=options.pop("labelled", _labelled()), **options)


def test_the_reranker_is_turned_on_where_it_wins_and_the_decision_is_recorded_and_shown(index_dir):
    _configure(index_dir, abstain=False)
    dense = Pipeline(FaqIndex.load(index_dir), PipelineConfig(top_k=6))
    assert sum(dense.run(text).hits[0].id == gold for text, gold in QUESTIONS) < len(QUESTIONS)  # room to win
    record = _decide(index_dir)
    assert record["on"] and record["reranker"] == "knowing-reranker"
    cell = record["development"]["labelled"]
    assert cell["delta_r1"] >= 1.0 and cell["lost"] == 0 and cell["questions"] == len(QUESTIONS)
    assert record["development"]["labelled"]["before"]["recall@1"] + cell["delta_r1"] == 100.0
    assert set(record["ms_per_question"]) == {"without", "with"}
    config = read_config(index_dir)
    assert config.rerank and config.reranker == "knowing-reranker"
    assert read_choice(index_dir) == record
    assert_decision_kept_and_shown(index_dir, CHOICE_FILE, "reranker on", "knowing-reranker")


def test_the_reranker_stays_off_where_it_loses_and_off_turns_it_off(index_dir):
    _configure(index_dir, abstain=False)
    record = _decide(index_dir, right=False)
    assert not record["on"] and record["development"]["labelled"]["delta_r1"] < 1.0
    assert "gains less than" in record["why"] and not read_config(index_dir).rerank
    _decide(index_dir)
    assert read_config(index_dir).rerank
    result = CliRunner().invoke(app, ["index", "rerank", str(index_dir), "--off"])
    assert result.exit_code == 0, result.output
    assert not read_config(index_dir).rerank and read_choice(index_dir)["on"] is False


def test_a_winning_reranker_stays_off_where_the_index_could_no_longer_abstain(index_dir):
    _configure(index_dir, abstain=True, thresholds={"dense@raw": 0.1})
    record = _decide(index_dir)
    assert not record["on"] and "no threshold for dense+rerank@raw" in record["why"]
    assert not read_config(index_dir).rerank
    _configure(index_dir, abstain=True, thresholds={"dense@raw": 0.1, "dense+rerank@raw": 0.5})
    assert _decide(index_dir)["on"] and read_config(index_dir).rerank


def test_an_index_without_a_gate_is_measured_and_turned_on_with_the_chosen_one(index_dir):
    _configure(index_dir, abstain=False, rerank_margin=None)
    record = _decide(index_dir)
    assert record["setting"]["rerank_margin"] == RERANK_MARGIN
    assert read_config(index_dir).rerank_margin == (RERANK_MARGIN if record["on"] else None)


def test_labelled_questions_are_required_and_a_wrong_index_is_one_line(index_dir, tmp_path):
    with pytest.raises(MedfaqError, match="give medfaq index rerank --dev-queries"):
        _decide(index_dir, labelled=[])
    assert read_choice(index_dir) is None
    result = CliRunner().invoke(app, ["index", "rerank", str(tmp_path)])
    assert result.exit_code != 0 and "Traceback" not in result.output


def test_a_decision_holds_for_its_encoder_and_reranker_only(index_dir, tmp_path):
    _configure(index_dir, abstain=False)
    record = _decide(index_dir)
    assert decided_for(index_dir, tmp_path / "knowing-reranker") is False
    assert decided_for(index_dir, record["reranker"]) is True
    reencoded = FaqIndex.load(index_dir)  # as `index build` with another encoder leaves it: the record is kept
    reencoded.manifest.encoder_fingerprint = "another-encoder"
    reencoded.save(index_dir)
    assert not decided_for(index_dir, record["reranker"])
    shown = CliRunner().invoke(app, ["index", "info", str(index_dir)])
    assert "decide again (`medfaq index rerank`)" in shown.output
