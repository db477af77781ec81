"""`medfaq index adapt`: the question writer, the round trip, the per-bank rule, undo, resume, and `index add` after."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from medfaq.app.cli import app
from medfaq.common.runtime import UNFINISHED_FILE, MedfaqError
from medfaq.index.faq_index import FaqIndex
from medfaq.index.storage import MANIFEST, read_manifest
from medfaq.retriever.decisions import adaptation
from medfaq.retriever.decisions.adaptation import DevQuery
from medfaq.retriever.decisions.adaptation_config import AdaptConfig
from medfaq.summarizer.generation import Summarizer
from medfaq.summarizer.question_writer import QuestionWriter, reversed_pairs, writer_input
from medfaq.summarizer.training.trainer import train_summarizer
from tests.conftest import (
    FAQ_ROWS,
    SUMMARY_PAIRS,
    CountingEncoder,
    assert_same_rankings,
    tiny_summarizer_config,
    write_jsonl,
)

ROW_PARTS = ["answers", "phrasings"]
USER_DEV = [DevQuery("alcohol and amoxicillin", frozenset({"f1"}))]


class TemplateWriter:
    """Writes fixed rewordings of each FAQ's question; counts the FAQs it was asked about."""

    def __init__(self, fail_after_calls: int | None = None):
        self.asked: list[str] = []
        self.fail_after_calls = fail_after_calls

    def write(self, faqs, k, seed=0, batch_size=16, top_p=0.9):
        if self.fail_after_calls is not None and len(self.asked) >= self.fail_after_calls:
            raise KeyboardInterrupt
        self.asked += [question for question, _ in faqs]
        templates = ["please tell me {}", "i wonder: {}", "my doctor said {}", "quick question {}"]
        return [[t.format(question.lower()) for t in templates[:k]] for question, _ in faqs]


def scripted_scores(monkeypatch, r_at_1: list[float]):
    """Make each development scoring return the next R@1 of `r_at_1` (MRR@10 the same): one per development set,
    the generated questions first."""
    values = iter(r_at_1)

    def scores(pipeline, queries):
        value = next(values)
        return {"r@1": value, "mrr@10": value, "queries": len(queries)}

    monkeypatch.setattr(adaptation, "dev_scores", scores)


def index_files(directory: Path) -> dict[str, bytes]:
    """Every file of an index, its manifest without the save counter and time (which every save moves on)."""
    files = {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
    manifest = json.loads(files.pop(MANIFEST))
    for key in ("generation", "updated", "checksums"):
        manifest.pop(key)
    files[MANIFEST] = json.dumps(manifest, sort_keys=True).encode()
    return files


@pytest.fixture(scope="module")
def tiny_writer(tmp_path_factory, tiny_bert_dir) -> Path:
    out = tmp_path_factory.mktemp("writer") / "writer"
    config = tiny_summarizer_config("mle", backbone=str(tiny_bert_dir), direction="ask", max_target_len=16)
    pairs = reversed_pairs(SUMMARY_PAIRS)
    train_summarizer(config, pairs[:4], pairs[4:], out)
    return out


def test_writer_samples_k_questions_per_faq_reproducibly_and_is_no_summarizer(tiny_writer):
    writer = QuestionWriter.load(tiny_writer)
    faqs = [("Is migraine inherited?", "Often it runs in families."), ("How is shingles treated?", "")]
    first = writer.write(faqs, k=3, seed=7, batch_size=2)
    assert len(first) == 2 and all(len(questions) == 3 for questions in first)
    assert writer.write(faqs, k=3, seed=7, batch_size=2) == first
    assert writer_input("Q?", "one two three") == "Q? | one two three" and writer_input("Q?", "") == "Q?"
    with pytest.raises(MedfaqError, match="is a question writer, not a summarizer"):
        Summarizer.load(tiny_writer)


def test_summarizer_is_no_question_writer(tiny_bert_dir, tmp_path):
    out = tmp_path / "summarizer"
    config = tiny_summarizer_config("mle", backbone=str(tiny_bert_dir))
    train_summarizer(config, SUMMARY_PAIRS[:4], SUMMARY_PAIRS[4:], out)
    with pytest.raises(MedfaqError, match="is a summarizer, not a question writer"):
        QuestionWriter.load(out)


def test_adapt_keeps_winning_parts_records_them_and_undo_restores_the_index(index_dir, monkeypatch):
    before = index_files(index_dir)
    scripted_scores(monkeypatch, [50.0, 40.0, 60.0, 41.0, 70.0, 42.0])  # before, + answers, + phrasings
    config = AdaptConfig(questions_per_faq=3, round_trip_depth=6, dev_faqs=2, parts=ROW_PARTS)
    record = adaptation.adapt(index_dir, config, USER_DEV, TemplateWriter(), progress=False, log=lambda _: None)
    assert record["applied"] == ["answers", "phrasings"]
    assert record["development_queries"] == {"generated": 2, "labelled": 1}
    assert record["round_trip"]["usable"] == 6 * 3 - 2
    index = FaqIndex.load(index_dir)
    origins = {p.origin for p in index.phrasings()}
    assert origins == {"adapt:answer", "adapt:question"}
    answer_rows = [p.text for p in index.phrasings() if p.origin == "adapt:answer"]
    assert len(answer_rows) == 2 * 5  # the answer's head, and the question before it; f5 has no answer
    assert "Moderate drinking is usually fine." in answer_rows
    assert "Can I drink alcohol while taking amoxicillin? Moderate drinking is usually fine." in answer_rows
    assert read_manifest(index_dir).adaptation["parts"]["phrasings"]["dev"]["generated"]["r@1"] == 70.0
    from medfaq.retriever.decisions.stage_choice import development_questions

    held = development_questions(index_dir)  # saved for other per-bank decisions (`medfaq index likelihood`)
    assert len(held) == 2 and all(len(query.golds) == 1 and query.text for query in held)
    from medfaq.eval.summarization_data import load_pairs

    pairs = load_pairs(str(index_dir))  # the round trip's questions, golds for a summarizer ranking this bank
    questions = {record.id: record.question for record in index.records()}
    assert len(pairs) == 16 and {pair.chq for pair in pairs} == {
        p.text for p in index.phrasings() if p.origin == "adapt:question"
    }
    assert {pair.faq for pair in pairs} <= set(questions.values()) and not {q.text for q in held} & {
        p.chq for p in pairs
    }
    info = CliRunner().invoke(app, ["index", "info", str(index_dir)])
    assert "answers, phrasings" in info.output and "covers all 6 FAQs" in info.output
    result = CliRunner().invoke(app, ["index", "adapt", str(index_dir), "--undo"])
    assert result.exit_code == 0 and f"removed {record['parts']['answers']['rows'] + 16} adapted rows" in result.output
    assert index_files(index_dir) == before
    assert not list(adaptation.work_dir(index_dir).glob("*.encoding"))  # the rows' encoding is not kept after


def test_undo_puts_back_the_files_from_before_the_adaptation_byte_for_byte(index_dir, monkeypatch):
    FaqIndex.delete_from(index_dir, ["f6"])  # a row BM25 keeps as deleted, which a rebuild would drop
    files = {str(p.relative_to(index_dir)): p.read_bytes() for p in sorted(index_dir.rglob("*")) if p.is_file()}
    manifest = json.loads(files.pop(MANIFEST))
    scripted_scores(monkeypatch, [50.0, 60.0])
    config = AdaptConfig(round_trip_depth=6, dev_faqs=1, parts=["answers"])
    record = adaptation.adapt(index_dir, config, writer=TemplateWriter(), progress=False, log=lambda _: None)
    assert record["applied"] == ["answers"]
    result = CliRunner().invoke(app, ["index", "adapt", str(index_dir), "--undo"])
    assert result.exit_code == 0 and "removed 8 adapted rows" in result.output
    undone = {str(p.relative_to(index_dir)): p.read_bytes() for p in sorted(index_dir.rglob("*")) if p.is_file()}
    restored = json.loads(undone.pop(MANIFEST))
    assert undone == files  # byte for byte
    assert restored.pop("generation") > manifest.pop("generation") and restored == manifest  # the save counter moves on
    assert not adaptation.work_dir(index_dir).joinpath(adaptation.BEFORE_DIR).exists()


def test_undo_after_an_index_add_removes_the_rows_and_keeps_the_new_faq(index_dir, tmp_path, monkeypatch):
    scripted_scores(monkeypatch, [50.0, 60.0])
    config = AdaptConfig(round_trip_depth=6, dev_faqs=1, parts=["answers"])
    adaptation.adapt(index_dir, config, writer=TemplateWriter(), progress=False, log=lambda _: None)
    new = write_jsonl(tmp_path / "new.jsonl", [{"id": "f7", "question": "Is flu contagious?", "answer": "Yes."}])
    assert CliRunner().invoke(app, ["index", "add", str(index_dir), str(new)]).exit_code == 0
    assert adaptation.kept_before(index_dir) is None  # the files from before would lose f7
    adaptation.undo(index_dir)
    index = FaqIndex.load(index_dir)
    assert "f7" in index and index.phrasings() == [] and not index.manifest.adaptation
    assert not adaptation.work_dir(index_dir).joinpath(adaptation.BEFORE_DIR).exists()


def test_an_index_never_adapted_has_no_training_pairs(index_dir):
    from medfaq.eval.summarization_data import load_pairs

    with pytest.raises(MedfaqError, match="no questions written for it yet"):
        load_pairs(str(index_dir))
    with pytest.raises(MedfaqError, match="is not an index"):
        load_pairs(str(index_dir.parent))


def test_rule_refuses_a_part_that_loses_and_keeps_an_experts_phrasings(index_dir, monkeypatch):
    FaqIndex.edit(
        index_dir, lambda index: index.editor().add_phrasings("f1", ["beer with antibiotics?"], origin="queue:1")
    )
    scripted_scores(monkeypatch, [50.0, 40.0, 49.0, 40.0, 55.0, 41.0])  # answers lose a point; phrasings gain
    config = AdaptConfig(questions_per_faq=2, round_trip_depth=6, dev_faqs=1, parts=ROW_PARTS)
    record = adaptation.adapt(index_dir, config, USER_DEV, TemplateWriter(), progress=False, log=lambda _: None)
    assert record["applied"] == ["phrasings"] and record["parts"]["answers"]["kept"] is False
    assert not [p for p in FaqIndex.load(index_dir).phrasings() if p.origin == "adapt:answer"]
    adaptation.undo(index_dir)
    assert [p.text for p in FaqIndex.load(index_dir).phrasings()] == ["beer with antibiotics?"]


def test_rule_needs_a_gain_and_no_loss_on_every_development_set():
    base = {"generated": {"r@1": 50.0, "mrr@10": 60.0}, "labelled": {"r@1": 40.0, "mrr@10": 50.0}}
    same = json.loads(json.dumps(base))
    assert not any(adaptation.part_kept(part, base, same) for part in ("answers", "phrasings", "encoder"))
    gain_generated = {**same, "generated": {"r@1": 50.0, "mrr@10": 61.0}}
    assert adaptation.part_kept("answers", base, gain_generated)
    assert not adaptation.part_kept("phrasings", base, gain_generated)  # learned from generated questions
    gain_labelled = {**same, "labelled": {"r@1": 41.0, "mrr@10": 50.0}}
    assert adaptation.part_kept("phrasings", base, gain_labelled) and adaptation.part_kept(
        "encoder", base, gain_labelled
    )
    loses_labelled = {"generated": {"r@1": 60.0, "mrr@10": 70.0}, "labelled": {"r@1": 39.0, "mrr@10": 55.0}}
    assert not adaptation.part_kept("answers", base, loses_labelled)
    only_generated = {"generated": base["generated"]}
    assert not adaptation.part_kept("encoder", only_generated, {"generated": {"r@1": 70.0, "mrr@10": 80.0}})


def test_without_labelled_queries_only_the_answers_are_tried_from_one_question_per_development_faq(
    index_dir, monkeypatch
):
    scripted_scores(monkeypatch, [50.0, 60.0])  # before, + answers: nothing else is scored
    writer = TemplateWriter()
    config = AdaptConfig(questions_per_faq=3, round_trip_depth=6, dev_faqs=2)
    record = adaptation.adapt(index_dir, config, writer=writer, progress=False, log=lambda _: None)
    assert record["applied"] == ["answers"] and record["development_queries"] == {"generated": 2}
    assert record["questions_written"] == 2 and len(writer.asked) == 2  # the held-back ones only, of 6 FAQs
    _, chosen = adaptation.writing_plan(config, {"phrasings": "", "encoder": ""}, FaqIndex.load(index_dir).records())
    assert sorted(writer.asked) == sorted(record.question for record in chosen)  # seeded: the dry run's sample too
    for part in ("phrasings", "encoder"):
        assert record["parts"][part] == {"kept": False, "rows": 0, "why": adaptation.NEEDS_LABELS}
    assert {p.origin for p in FaqIndex.load(index_dir).phrasings()} == {"adapt:answer"}
    adaptation.undo(index_dir)
    no_answers = [replace(record, answer="") for record in FaqIndex.load(index_dir).records()]
    with pytest.raises(
        adaptation.NothingToAdapt,
        match="nothing to adapt: answers: no FAQ of the bank has an answer; phrasings, encoder: needs",
    ):
        adaptation.parts_to_try(config, no_answers, labelled=False)
    assert adaptation.parts_to_try(config, no_answers, labelled=True) == {"answers": "no FAQ of the bank has an answer"}
    assert adaptation.parts_to_try(replace(config, force=True), no_answers, labelled=False) == {
        "answers": "no FAQ of the bank has an answer"
    }


def test_rows_are_refused_where_they_push_down_the_questions_of_faqs_they_give_no_row(index_dir, monkeypatch):
    records = FaqIndex.load(index_dir).records()
    dev = [DevQuery(f"about {record.id}", frozenset({record.id})) for record in records]
    rows = adaptation.answer_rows(records, AdaptConfig.answer_words)
    assert [query.golds for query in adaptation.without_rows(dev, rows)] == [{"f5"}]  # the FAQ with no answer
    assert adaptation.without_rows(dev, {}) == [] and adaptation.without_rows(dev[:4], rows) == []
    assert adaptation.without_rows(dev, {"f5": []} | rows) == adaptation.without_rows(dev, rows)  # empty: no row
    # all six FAQs held back, so f5's question is one; scored: generated, its own set; then both after the rows
    scripted_scores(monkeypatch, [50.0, 50.0, 60.0, 40.0])  # the rows gain overall and lose f5's question
    config = AdaptConfig(dev_faqs=6, parts=["answers"])
    record = adaptation.adapt(index_dir, config, writer=TemplateWriter(), progress=False, log=lambda _: None)
    decision = record["parts"]["answers"]
    assert record["applied"] == [] and decision["kept"] is False and decision["dev"]["generated"]["r@1"] == 60.0
    assert decision[adaptation.WITHOUT_ROWS] == {
        "before": {"r@1": 50.0, "mrr@10": 50.0, "queries": 1},
        "after": {"r@1": 40.0, "mrr@10": 40.0, "queries": 1},
    }
    assert not FaqIndex.load(index_dir).phrasings()


def test_an_interrupted_generation_resumes_where_it_stopped(index_dir, tmp_path):
    records = FaqIndex.load(index_dir).records()
    config = AdaptConfig(questions_per_faq=2, batch_size=1)  # chunks of 4 FAQs
    cache = tmp_path / "questions.jsonl"
    with pytest.raises(KeyboardInterrupt):
        adaptation.generated_questions(records, config, cache, TemplateWriter(fail_after_calls=4), progress=False)
    assert len(adaptation.read_generated(cache)) == 4
    with cache.open("a") as handle:
        handle.write('{"faq_id": "f5", "sampl')  # a line cut by the kill
    second = TemplateWriter()
    found = adaptation.generated_questions(records, config, cache, second, progress=False)
    assert len(second.asked) == 2 and set(found) == {r.id for r in records}
    third = TemplateWriter()
    longer = adaptation.generated_questions(records, AdaptConfig(questions_per_faq=3), cache, third, progress=False)
    assert len(third.asked) == 6 and all(len(samples) == 3 for samples in longer.values())  # more samples: written
    fewer = adaptation.generated_questions(records, AdaptConfig(questions_per_faq=1), cache, third, progress=False)
    assert len(third.asked) == 6 and fewer == {faq: samples[:1] for faq, samples in longer.items()}


def test_index_add_after_adapt_says_the_adaptation_is_partial(index_dir, tmp_path, monkeypatch):
    scripted_scores(monkeypatch, [50.0, 60.0])
    config = AdaptConfig(questions_per_faq=2, round_trip_depth=6, dev_faqs=1, parts=ROW_PARTS)
    adaptation.adapt(index_dir, config, writer=TemplateWriter(), progress=False, log=lambda _: None)
    new = write_jsonl(tmp_path / "new.jsonl", [{"id": "f7", "question": "Is flu contagious?", "answer": "Yes."}])
    result = CliRunner().invoke(app, ["index", "add", str(index_dir), str(new)])
    assert result.exit_code == 0 and "covers 6 of 7 FAQs" in result.output
    with pytest.raises(MedfaqError, match="already adapted"):
        adaptation.adapt(index_dir, config, writer=TemplateWriter(), progress=False)


def test_adapt_command_errors_are_one_line(index_dir, tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["index", "adapt", str(index_dir), "--undo"])
    assert result.exit_code != 0 and "is not adapted" in result.output
    result = runner.invoke(app, ["index", "adapt", str(index_dir), "--dev-queries", str(tmp_path / "q.jsonl")])
    assert result.exit_code != 0 and "go together" in result.output
    result = runner.invoke(app, ["index", "adapt", str(index_dir), "--part", "everything"])
    assert result.exit_code != 0 and "unknown adaptation part" in result.output
    for writer in ("question-writer", str(tmp_path)):  # not set up; a directory that is no trained model
        result = runner.invoke(app, ["index", "adapt", str(index_dir), "--writer", writer, "--dry-run"])
        assert result.exit_code != 0 and "no question writer" in result.output and "medfaq setup" in result.output
    (tmp_path / "train_config.json").write_text("{}")
    (tmp_path / UNFINISHED_FILE).touch()  # a training run stopped before its first checkpoint
    result = runner.invoke(app, ["index", "adapt", str(index_dir), "--writer", str(tmp_path), "--dry-run"])
    assert result.exit_code != 0 and "stopped training before its end: run `medfaq setup`" in result.output


def test_user_queries_are_a_development_set_of_their_own(index_dir, monkeypatch):
    # answers gain on the generated questions and lose one of the user's: refused; phrasings gain on both
    scripted_scores(monkeypatch, [50.0, 40.0, 55.0, 39.0, 60.0, 41.0])
    config = AdaptConfig(questions_per_faq=2, round_trip_depth=6, dev_faqs=1, parts=ROW_PARTS)
    record = adaptation.adapt(index_dir, config, USER_DEV, TemplateWriter(), progress=False, log=lambda _: None)
    assert record["development_queries"] == {"generated": 1, "labelled": 1}
    assert record["applied"] == ["phrasings"]


def test_adapted_encoder_is_saved_with_its_fingerprint_and_undo_restores_the_vectors(index_dir, monkeypatch):
    from medfaq.index.encoder import Encoder

    before = index_files(index_dir)
    original = read_manifest(index_dir)
    scripted_scores(monkeypatch, [50.0, 40.0, 60.0, 41.0])  # before, with the adapted encoder
    config = AdaptConfig(
        questions_per_faq=3,
        round_trip_depth=6,
        dev_faqs=1,
        parts=["encoder"],
        encoder_labels="hard",
        near_duplicate=1.1,
    )  # a random tiny encoder finds every FAQ a near-duplicate of every other
    record = adaptation.adapt(index_dir, config, USER_DEV, TemplateWriter(), progress=False, log=lambda _: None)
    decision = record["parts"]["encoder"]
    assert record["applied"] == ["encoder"] and decision["labels"] == "hard" and decision["rows"] > 0
    adapted = read_manifest(index_dir)
    assert adapted.encoder == decision["model"] and Path(decision["model"]).parent == adaptation.work_dir(index_dir)
    assert adapted.encoder_fingerprint == Encoder(decision["model"]).fingerprint != original.encoder_fingerprint
    index = FaqIndex.load(index_dir)
    assert index.search_dense(["How is shingles treated?"], 1)[0][0][0] == "f3"  # searchable with its new encoder
    adaptation.undo(index_dir)
    assert index_files(index_dir) == before


def test_margin_labels_scale_the_rerankers_margins_to_the_students(tiny_encoder_dir):
    from medfaq.retriever.biencoder.adapted import cosine_margins, train_adapted_encoder
    from medfaq.retriever.training.config import EncoderTrainConfig

    triplets = [(f"question {i}", f"faq {i}", f"other faq {i}") for i in range(8)]
    config = EncoderTrainConfig(model_type="biencoder", task="faq", init=str(tiny_encoder_dir), loss="mnrl", epochs=1)
    model = train_adapted_encoder(str(tiny_encoder_dir), triplets, config, "margin", margins=np.full(8, 5.0))
    assert cosine_margins(model, triplets).shape == (8,)
    with pytest.raises(MedfaqError, match="one reranker margin per triplet"):
        train_adapted_encoder(str(tiny_encoder_dir), triplets, config, "margin", margins=None)


def test_train_question_writer_on_a_tiny_causal_model_writes_with_its_training_vocabulary(
    tmp_path, minilm_dir, shared_data
):
    from transformers import Gemma3TextConfig

    from tests.test_summarizer_causal import _save_causal, _tiny_sizes

    config = Gemma3TextConfig(**_tiny_sizes(30522), sliding_window=16, layer_types=["sliding_attention"] * 2)
    backbone = _save_causal(tmp_path / "tiny", config, minilm_dir)
    out = tmp_path / "writer"
    command = ["train", "question-writer", "--backbone", str(backbone), "--out", str(out), "--max-pairs", "8"]
    result = CliRunner().invoke(app, [*command, "--data-root", str(shared_data), "--train-data", "meqsum:train"])
    assert result.exit_code == 0, result.output
    assert "samples over" in result.output and (out / "vocabulary.json").is_file()
    writer = QuestionWriter.load(out, precision="fp32")
    assert writer.vocabulary and len(writer.vocabulary) < 30522
    [questions] = writer.write([("Is migraine inherited?", "It often runs in families.")], k=2, seed=0)
    assert len(questions) == 2  # sampled over the kept ids (tests/test_vocabulary.py checks the ids themselves)
    assert writer.write([("Is migraine inherited?", "It often runs in families.")], k=2, seed=0) == [questions]


def test_a_benchmarks_development_queries_stand_for_a_users_labelled_ones():
    from experiments.adaptation_gain import labelled_dev
    from medfaq.eval.benchmarks import Benchmark

    queries = [
        {"_id": "q1", "text": "beer on amoxicillin?", "metadata": {"split": "dev"}},
        {"_id": "q2", "text": "is shingles catching?", "metadata": {"split": "dev"}},
        {"_id": "q3", "text": "a test question", "metadata": {}},
        {"_id": "q4", "text": "out of scope", "metadata": {"split": "dev", "ood": True}},
    ]
    qrels = {"q1": {"f1": 1, "f2": 0}, "q2": {"f3": 1}, "q3": {"f4": 1}}
    benchmark = Benchmark("toy", [], queries, qrels)
    assert labelled_dev(benchmark) == [
        DevQuery("beer on amoxicillin?", frozenset({"f1"})),
        DevQuery("is shingles catching?", frozenset({"f3"})),
    ]
    with pytest.raises(MedfaqError, match="no judged development queries"):
        labelled_dev(Benchmark("toy", [], queries[2:3], qrels))


def test_answer_rows_are_the_answers_head_and_the_question_before_it(faq_records):
    long = replace(faq_records[0], answer="one two three four five")
    assert adaptation.answer_rows([long, faq_records[4]], words=3) == {
        "f1": ["one two three", "Can I drink alcohol while taking amoxicillin? one two three"]
    }
    assert adaptation.answer_rows([long], words=3, with_question=False) == {"f1": ["one two three"]}


def test_answer_rows_are_measured_without_a_writer_and_leave_the_index_as_it_was(index_dir, tmp_path):
    from experiments.adaptation_gain import measure
    from medfaq.eval.benchmarks import Benchmark
    from tests.conftest import CONSUMER_QUESTIONS

    queries = [{"_id": f"q{n}", "text": text} for n, (text, _) in enumerate(CONSUMER_QUESTIONS)]
    qrels = {f"q{n}": {faq: 1} for n, (_, faq) in enumerate(CONSUMER_QUESTIONS)}
    bench = Benchmark("toy", [], queries, qrels).save(tmp_path / "bench")
    index_dir.rename(bench / "index")
    before = index_files(bench / "index")
    report = measure(bench, ["answer-rows", "answer-head-rows"], seed=0, questions=1, depth=1)
    assert report["answer-rows"]["rows"] == 10 and report["answer-head-rows"]["rows"] == 5
    assert report["answer-rows"]["applied"] == ["answers"] and 0 <= report["answer-rows"]["test"]["recall@1"] <= 100
    assert index_files(bench / "index") == before


def test_dry_run_plans_to_write_only_for_the_development_sample_without_labels(index_dir, tiny_writer):
    config = AdaptConfig(writer=str(tiny_writer), dev_faqs=2)
    plan = adaptation.dry_run_plan(index_dir, config)
    assert "6 FAQs; 2 to write for, 0 of them already written" in plan
    assert "write 1 question(s) for each of 2 FAQs" in plan and "not tried: phrasings" in plan
    assert "write 2 question(s) for each of 6 FAQs" in adaptation.dry_run_plan(index_dir, config, labelled=True)
    assert "encode 10 answer rows of 5 FAQs: about" in plan  # timed on a sample of them


def test_a_dry_run_on_a_bank_without_answers_says_there_is_nothing_to_adapt_and_succeeds(tmp_path, tiny_encoder_dir):
    faqs = write_jsonl(tmp_path / "faqs.jsonl", [{**row, "answer": ""} for row in FAQ_ROWS])
    runner = CliRunner()
    build = ["index", "build", str(faqs), "--out", str(tmp_path / "idx"), "--encoder", str(tiny_encoder_dir)]
    assert runner.invoke(app, build).exit_code == 0
    result = runner.invoke(app, ["index", "adapt", str(tmp_path / "idx"), "--dry-run"])  # no question writer needed
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("6 FAQs; nothing to adapt: answers: no FAQ of the bank has an answer")
    result = runner.invoke(app, ["index", "adapt", str(tmp_path / "idx")])  # the run itself is refused
    assert result.exit_code == 2 and result.stderr.startswith("error: nothing to adapt")


def test_answer_rows_interrupted_while_encoding_resume_where_they_stopped(index_dir, monkeypatch):
    from medfaq.index import chunked_encoding

    monkeypatch.setattr(chunked_encoding, "ENCODE_CHUNK", 2)
    encoder = FaqIndex.load(index_dir).encoder
    index = FaqIndex.load(index_dir, CountingEncoder(encoder, fail_after=2))
    rows = adaptation.answer_rows(index.records(), AdaptConfig.answer_words)
    staging = adaptation.rows_staging(index_dir, index, "answers", rows)
    with pytest.raises(KeyboardInterrupt):
        adaptation.add_rows(index, rows, "adapt:answer", staging=staging)
    assert index.phrasings() == [] and len(list(staging.glob("chunk-*.npy"))) == 2
    resumed_encoder, whole_encoder = CountingEncoder(encoder), CountingEncoder(encoder)
    resumed, whole = FaqIndex.load(index_dir, resumed_encoder), FaqIndex.load(index_dir, whole_encoder)
    keys = adaptation.add_rows(resumed, rows, "adapt:answer", staging=staging)
    adaptation.add_rows(whole, rows, "adapt:answer")
    assert len(keys) == 10 and resumed_encoder.calls == whole_encoder.calls - 2 > 0  # only the chunks left
    queries = encoder.encode([text for texts in rows.values() for text in texts])  # each row finds itself
    assert_same_rankings(resumed.search_vectors(queries, 6), whole.search_vectors(queries, 6))


def test_adapt_options_are_the_config_s_declarations_and_reach_it(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(adaptation, "dry_run_plan", lambda directory, config, labelled: seen.append(config) or "plan")
    given = ["-k", "3", "--depth", "0", "--part", "answers", "--labels", "hard", "--dev-faqs", "5", "--seed", "7"]
    for options in ([], given):
        result = CliRunner().invoke(app, ["index", "adapt", str(tmp_path), *options, "--dry-run"])
        assert result.exit_code == 0, result.output
    changes = {"questions_per_faq": 3, "round_trip_depth": 0, "parts": ["answers"], "encoder_labels": "hard"}
    assert seen == [AdaptConfig(), AdaptConfig(**changes, dev_faqs=5, seed=7)]
    result = CliRunner().invoke(app, ["index", "adapt", str(tmp_path), "--dev-faqs", "0"])
    assert result.exit_code == 2 and "dev_faqs must be a whole number of at least 1" in result.output
