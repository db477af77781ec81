"""A model directory says what kind of model it holds (common/model_kinds.py): `medfaq train` declares it, older
directories are told by their files, and every loader refuses another kind in one line before any model loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfaq.app.cli import app
from medfaq.common.runtime import MedfaqError
from tests.conftest import FAQ_ROWS, write_jsonl

runner = CliRunner()


def medfaq(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(result, pattern: str) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and pattern in lines[0], result.stderr
    return lines[0]


def legacy_config(directory: Path, **values: object) -> Path:
    """`directory` with a ``train_config.json`` of `values` and no declared kind (as saved before kinds were)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train_config.json").write_text(json.dumps(values), encoding="utf-8")
    (directory / "config.json").write_text("{}", encoding="utf-8")
    return directory


@pytest.fixture
def trained_biencoder(tmp_path, tiny_encoder_dir) -> Path:
    """The tiny sentence-transformers model with the config `medfaq train biencoder` saves beside its models."""
    from medfaq.retriever.training.config import EncoderTrainConfig

    out = Path(shutil.copytree(tiny_encoder_dir, tmp_path / "biencoder"))
    EncoderTrainConfig(model_type="biencoder", task="faq", loss="mnrl").save(out)
    return out


def test_training_configs_declare_the_kind_and_older_directories_show_it_by_their_files(tmp_path, tiny_encoder_dir):
    from medfaq.common.model_kinds import KIND_KEY, TRAIN_CONFIG, check_model_kind, model_kind
    from medfaq.retriever.biencoder.student_config import StudentTrainConfig
    from medfaq.retriever.training.config import EncoderTrainConfig
    from medfaq.summarizer.training.config import SummarizerTrainConfig

    saved = {
        "biencoder": lambda out: EncoderTrainConfig(model_type="biencoder", loss="contrastive").save(out),
        "crossencoder": lambda out: EncoderTrainConfig().save(out),
        "student": lambda out: StudentTrainConfig().save(out),
        "summarizer": lambda out: SummarizerTrainConfig().save(out),
        "question-writer": lambda out: SummarizerTrainConfig(direction="ask").save(out),
    }
    for kind, save in saved.items():
        out = tmp_path / "declared" / kind
        out.mkdir(parents=True)
        save(out)
        assert json.loads((out / TRAIN_CONFIG).read_text())[KIND_KEY] == kind and model_kind(out) == kind
    assert SummarizerTrainConfig.load(tmp_path / "declared" / "question-writer").direction == "ask"

    legacy = tmp_path / "legacy"
    assert model_kind(legacy_config(legacy / "b", model_type="biencoder", task="faq")) == "biencoder"
    assert model_kind(legacy_config(legacy / "c", model_type="crossencoder", task="mqp")) == "crossencoder"
    assert model_kind(legacy_config(legacy / "d", model_type="biencoder", task="distill")) == "student"
    assert model_kind(legacy_config(legacy / "s", variant="ecl")) == "summarizer"  # before `direction` existed
    assert model_kind(legacy_config(legacy / "w", variant="mle", direction="ask")) == "question-writer"
    check_model_kind(legacy / "w", "question-writer")  # an older writer still loads as one
    with pytest.raises(MedfaqError, match="is a question writer, not a summarizer"):
        check_model_kind(legacy / "w", "summarizer")
    head = legacy / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"]}))
    assert model_kind(head) == "crossencoder"
    assert model_kind(tiny_encoder_dir) == "biencoder"  # sentence-transformers modules.json
    plain = legacy / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    assert model_kind(plain) is None
    check_model_kind(plain, "summarizer")  # a plain model passes where plain models are taken
    with pytest.raises(MedfaqError, match="is a plain model .* not a cross-encoder"):
        check_model_kind(plain, "crossencoder", plain=False)


def test_a_trained_biencoder_is_no_summarizer(trained_biencoder, index_dir):
    line = one_line_error(medfaq("summarize", "--model", trained_biencoder, "is flu catching"), "is a bi-encoder")
    assert "not a summarizer" in line and "`medfaq train summarizer` trains one" in line
    search = ["search", "--index", index_dir, "--mode", "bm25", "--summarize", "--summarizer", trained_biencoder]
    one_line_error(medfaq(*search, "is flu catching"), "is a bi-encoder, not a summarizer")


def test_a_question_writer_is_no_likelihood_summarizer(tmp_path, index_dir):
    writer = legacy_config(tmp_path / "writer", variant="mle", direction="ask")  # saved before kinds were declared
    queries = write_jsonl(tmp_path / "queries.jsonl", [{"_id": "q1", "text": "beer on amoxicillin?"}])
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tf1\t1\n", encoding="utf-8")
    dev = ("--dev-queries", queries, "--dev-qrels", tmp_path / "qrels.tsv")
    result = medfaq("index", "likelihood", index_dir, "--summarizer", writer, *dev)
    one_line_error(result, "is a question writer, not a summarizer")
    assert not (index_dir / "likelihood.json").exists()


def test_an_index_is_encoded_by_a_biencoder_only(tmp_path):
    summarizer = legacy_config(tmp_path / "summarizer", variant="ecl")
    faqs = write_jsonl(tmp_path / "faqs.jsonl", FAQ_ROWS)
    result = medfaq("index", "build", faqs, "--out", tmp_path / "idx", "--encoder", summarizer)
    one_line_error(result, "is a summarizer, not a bi-encoder")
    assert not (tmp_path / "idx").exists()
