"""The per-index choice of the likelihood stage (retriever/decisions/likelihood_choice.py) on a tiny index: the rule
turns the
stage on where it wins on the development questions and off where it does not, records the decision beside the
index, reloads it, and reads the questions `medfaq index adapt` held back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from medfaq.app.cli import app
from medfaq.common.runtime import MedfaqError
from medfaq.index.faq_index import FaqIndex
from medfaq.index.records import FaqRecord
from medfaq.retriever.decisions.adaptation import DEVELOPMENT_FILE, DevQuery, save_development, work_dir
from medfaq.retriever.decisions.likelihood_choice import (
    CHOICE_FILE,
    choose_likelihood,
    decided_among,
    decided_for_encoder,
    describe_choice,
    read_choice,
)
from medfaq.retriever.pipeline import Pipeline, PipelineConfig
from medfaq.retriever.pipeline_file import read_config
from medfaq.summarizer.likelihood import TokenScores
from tests.conftest import DEVELOPMENT_QUESTIONS as QUESTIONS
from tests.conftest import FAQ_ROWS, assert_decision_kept_and_shown


class KnowingScorer:
    """A likelihood stage that finds the gold FAQ question of each question likeliest (`right`), or least likely."""

    name, precision = "knowing-scorer", "fp32"

    def __init__(self, golds: dict[str, str], right: bool = True, name: str = "knowing-scorer") -> None:
        self.golds, self.right, self.kept, self.name = golds, right, 0, name

    def keep(self, texts, bank: str = "") -> None:
        self.kept = len(texts)

    def token_scores(self, query, candidates):
        gold = self.golds.get(query)
        wins = [(text == gold) == self.right for text in candidates]
        return TokenScores(np.array([-1.0 if win else -9.0 for win in wins]), np.full(len(candidates), 3))

    def prior_scores(self, candidates):
        return TokenScores(np.full(len(candidates), -5.0), np.full(len(candidates), 3))


@pytest.fixture
def index_dir(tmp_path, tiny_encoder):
    FaqIndex.build([FaqRecord.from_dict(row) for row in FAQ_ROWS], tiny_encoder, progress=False).save(tmp_path / "ix")
    return tmp_path / "ix"


def _labelled():
    return [DevQuery(text, frozenset([gold])) for text, gold in QUESTIONS]


def _golds():
    questions = {row["id"]: row["question"] for row in FAQ_ROWS}
    return {text: questions[gold] for text, gold in QUESTIONS}


def _dense_r1(directory) -> int:
    pipeline = Pipeline(FaqIndex.load(directory), PipelineConfig(top_k=6))
    return sum(pipeline.run(text).hits[0].id == gold for text, gold in QUESTIONS)


def test_the_stage_is_turned_on_where_it_wins_and_the_decision_is_recorded_and_shown(index_dir):
    assert _dense_r1(index_dir) < len(QUESTIONS)  # the tiny encoder misses some: room to win
    scorer = KnowingScorer(_golds())
    record = choose_likelihood(
        index_dir, labelled=_labelled(), depth=6, progress=False, log=lambda _: None, scorers=[scorer]
    )
    assert scorer.kept == len(FAQ_ROWS)  # its vocabulary: this bank's questions
    assert record["on"] and record["summarizer"] == "knowing-scorer"
    cell = record["development"]["labelled"]
    assert cell["delta_r1"] >= 1.0 and cell["lost"] == 0 and cell["questions"] == len(QUESTIONS)
    config = read_config(index_dir)
    assert config.likelihood and config.summarizer == "knowing-scorer" and config.likelihood_depth == 6
    assert config.likelihood_weight == record["setting"]["likelihood_weight"]
    assert config.rerank_margin == record["setting"]["rerank_margin"]
    assert read_choice(index_dir) == record
    assert_decision_kept_and_shown(index_dir, CHOICE_FILE, "likelihood stage on", "knowing-scorer")


def test_the_stage_stays_off_where_it_loses_and_off_turns_it_off(index_dir):
    record = choose_likelihood(
        index_dir,
        labelled=_labelled(),
        depth=6,
        progress=False,
        log=lambda _: None,
        scorers=[KnowingScorer(_golds(), right=False)],
    )
    assert not record["on"] and record["development"]["labelled"]["delta_r1"] < 1.0
    assert not read_config(index_dir).likelihood
    choose_likelihood(
        index_dir, labelled=_labelled(), depth=6, progress=False, log=lambda _: None, scorers=[KnowingScorer(_golds())]
    )
    assert read_config(index_dir).likelihood
    result = CliRunner().invoke(app, ["index", "likelihood", str(index_dir), "--off"])
    assert result.exit_code == 0, result.output
    assert not read_config(index_dir).likelihood and read_choice(index_dir)["on"] is False


def test_the_questions_adapt_held_back_vote_but_alone_never_turn_the_stage_on(index_dir):
    with pytest.raises(MedfaqError, match="no labelled development questions for .*never alone"):
        choose_likelihood(index_dir, progress=False, log=lambda _: None, scorers=[KnowingScorer({})])
    work_dir(index_dir).mkdir()
    save_development(work_dir(index_dir) / DEVELOPMENT_FILE, _labelled())
    with pytest.raises(MedfaqError, match="no labelled development questions"):
        choose_likelihood(index_dir, progress=False, log=lambda _: None, scorers=[KnowingScorer(_golds())])
    assert not read_config(index_dir).likelihood
    both = choose_likelihood(
        index_dir, labelled=_labelled(), depth=6, progress=False, log=lambda _: None, scorers=[KnowingScorer(_golds())]
    )
    assert list(both["development"]) == ["labelled", "generated"] and both["on"]
    assert both["development"]["generated"]["questions"] == len(QUESTIONS)


def test_the_command_refuses_a_directory_that_is_no_index(tmp_path):
    result = CliRunner().invoke(app, ["index", "likelihood", str(tmp_path)])
    assert result.exit_code != 0 and "Traceback" not in result.output


def test_a_decision_measured_on_a_copy_counts_only_golds_in_the_bank_and_is_written_to_the_index(
    index_dir, tmp_path, tiny_encoder
):
    copy = tmp_path / "with-golds"
    index = FaqIndex.load(index_dir)
    index.editor().add([FaqRecord("g1", "Can I take melatonin with sertraline?")])
    index.save(copy)
    questions = [*_labelled(), DevQuery("melatonin and zoloft together ok?", frozenset(["g1"]))]
    questions.append(DevQuery("a question whose FAQ is nowhere", frozenset(["missing"])))
    golds = {**_golds(), "melatonin and zoloft together ok?": "Can I take melatonin with sertraline?"}
    lines = []
    record = choose_likelihood(
        index_dir,
        labelled=questions,
        depth=7,
        progress=False,
        log=lines.append,
        scorers=[KnowingScorer(golds)],
        measured_on=copy,
    )
    # the question whose gold FAQ exists only in the copy (inserted there) is no evidence about the bank
    assert record["development"]["labelled"]["questions"] == len(QUESTIONS)
    assert f"left out 1 of {len(QUESTIONS) + 2} questions (no gold FAQ in the index)" in lines[0]
    assert f"left out 1 of {len(QUESTIONS) + 1} questions whose gold FAQs are only in {copy}" in lines[1]
    assert record["measured_on"] == str(copy)
    assert read_config(index_dir).likelihood and read_choice(index_dir) == record and read_choice(copy) is None


def test_a_decision_holds_only_for_the_encoder_it_was_measured_with(index_dir):
    scorer = KnowingScorer(_golds())
    record = choose_likelihood(
        index_dir, labelled=_labelled(), depth=6, progress=False, log=lambda _: None, scorers=[scorer]
    )
    assert record["encoder_fingerprint"] == FaqIndex.load(index_dir).manifest.encoder_fingerprint != ""
    assert decided_for_encoder(index_dir)
    reencoded = FaqIndex.load(index_dir)  # as `index build` with another encoder leaves it: the record is kept
    reencoded.manifest.encoder_fingerprint = "another-encoder"
    reencoded.save(index_dir)
    assert read_choice(index_dir) == record and not decided_for_encoder(index_dir)
    shown = CliRunner().invoke(app, ["index", "info", str(index_dir)])
    assert shown.exit_code == 0 and "measured with another encoder than the index's: decide again" in shown.output


def test_among_several_summarizers_the_one_that_wins_most_is_kept_and_the_first_on_a_tie(index_dir, tmp_path):
    losing, winning = KnowingScorer(_golds(), right=False, name="seed-0"), KnowingScorer(_golds(), name="seed-1")
    record = choose_likelihood(
        index_dir, labelled=_labelled(), depth=6, progress=False, log=lambda _: None, scorers=[losing, winning]
    )
    assert record["on"] and record["summarizer"] == "seed-1" and read_config(index_dir).summarizer == "seed-1"
    assert losing.kept == winning.kept == len(FAQ_ROWS)
    scored = {entry["summarizer"]: entry["development"]["labelled"] for entry in record["summarizers_scored"]}
    assert (
        scored["seed-0"]["delta_r1"]
        < 1.0
        <= scored["seed-1"]["delta_r1"]
        == record["development"]["labelled"]["delta_r1"]
    )
    assert "(the best of 2 scored)" in describe_choice(record)
    assert decided_among(index_dir, [Path("seed-0"), Path("seed-1")])
    assert not decided_among(index_dir, [Path("seed-1"), Path("seed-2")])  # a seed trained since: decide again
    tie = [KnowingScorer(_golds(), name="first"), KnowingScorer(_golds(), name="second")]
    record = choose_likelihood(
        index_dir, labelled=_labelled(), depth=6, progress=False, log=lambda _: None, scorers=tie
    )
    assert record["summarizer"] == "first"


def test_a_few_gains_are_too_few_to_turn_the_stage_on(index_dir):
    """Six questions of which the stage fixes a few and breaks none gain well over a point of R@1, yet a sign test
    cannot tell that from chance: the stage stays off and the record says why."""
    from tests.conftest import CONSUMER_QUESTIONS

    few = [DevQuery(text, frozenset([gold])) for text, gold in CONSUMER_QUESTIONS]
    record = choose_likelihood(
        index_dir, labelled=few, depth=6, progress=False, log=lambda _: None, scorers=[KnowingScorer(_golds())]
    )
    cell = record["development"]["labelled"]
    assert cell["delta_r1"] >= 1.0 and cell["lost"] == 0 and 0 < cell["gained"] <= 4
    assert not record["on"] and "too few to conclude (one-sided sign test p = " in record["why"]
    assert not read_config(index_dir).likelihood
