"""`medfaq train student`: the texts it is distilled on, the teacher's vectors cached and resumed, a tiny student that
learns a tiny teacher of another dimension (in its own space, and through a projection), its saved config and
fingerprint, an index built with it on ONNX."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from medfaq.app.cli import app
from medfaq.index import chunked_encoding
from medfaq.retriever.biencoder.distill_data import (
    TEACHER_VECTORS,
    SourceText,
    distillation_texts,
    source_counts,
    split_texts,
    teacher_cache_dir,
    teacher_vectors,
)
from medfaq.retriever.training.pair_data import normalise, quebec_query_split
from tests.conftest import save_tiny_bert, write_jsonl

runner = CliRunner()
TOPICS = ["gout", "asthma", "acne", "eczema", "migraine", "shingles", "measles", "anemia", "lupus", "psoriasis"]
LEAKED = "My son has a rash after amoxicillin, is it an allergy?"


def medfaq(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(result, pattern: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert pattern in lines[0], lines[0]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """Every source of the distillation texts in the shared/data layout, with an evaluation question copied into a
    training split and a question shared by two sources."""
    root = tmp_path_factory.mktemp("data")
    kinds = ["symptoms", "causes", "treatment"]
    medquad = [
        {"id": f"{topic}-{kind}", "question": f"What are the {kind} of {topic} ?", "answer": ""}
        for topic in TOPICS
        for kind in kinds
    ]
    write_jsonl(_dir(root / "medquad") / "medquad.jsonl", medquad)
    for name in ("meqsum", "healthcaremagic", "chq_summ"):
        rows = [
            {"chq": f"{name} asks: my {topic} got worse, what can I do?", "faq": f"How to treat {topic}?"}
            for topic in TOPICS[:4]
        ]
        write_jsonl(_dir(root / name) / "train.jsonl", [*rows, {"chq": LEAKED, "faq": "Is it amoxicillin allergy?"}])
    write_jsonl(root / "meqsum" / "test.jsonl", [{"chq": LEAKED, "faq": "What is amoxicillin allergy?"}])
    rqe = [
        {"pid": str(i), "chq": f"Can {t} come back?", "faq": f"Does {t} recur?", "label": 1}
        for i, t in enumerate(TOPICS)
    ]
    write_jsonl(_dir(root / "mediqa2019_rqe") / "train.jsonl", rqe)
    mqp = "".join(f"d1,Is {t} contagious?,Can I catch {t} from someone?,1\n" for t in TOPICS)
    (_dir(root / "mqp") / "mqp.csv").write_text(mqp + "d2,What are the symptoms of gout ?,Is gout painful?,0\n")
    quebec = _dir(root / "covid_faq" / "quebec_mila")
    write_jsonl(quebec / "faqs.jsonl", [{"passage_id": 0, "faq_question": "Must I wear a mask on the bus?"}])
    write_jsonl(
        quebec / "train.jsonl",
        [{"id": i, "question": f"bus mask rule number {i}?", "passage_id": 0, "is_ood": False} for i in range(12)],
    )  # fmt: skip
    return root


def _dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_teacher_dir(tmp_path_factory, minilm_dir) -> Path:
    """A sentence-transformers model 48 wide (the tiny student is 32 wide), random weights, MiniLM's tokenizer."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    bert = save_tiny_bert(tmp_path_factory.mktemp("teacher_bert"), minilm_dir, hidden=48, layers=1, seed=1)
    transformer = Transformer(str(bert), max_seq_length=64)
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    out = tmp_path_factory.mktemp("teacher")
    SentenceTransformer(modules=[transformer, pooling, Normalize()], device="cpu").save(str(out))
    return out


def test_texts_are_every_source_deduplicated_without_evaluation_questions(data_root):
    texts = distillation_texts(data_root)
    keys = [normalise(item.text) for item in texts]
    assert len(keys) == len(set(keys))
    assert normalise(LEAKED) not in keys  # a MeQSum test question, copied into three training splits
    assert normalise("Is it amoxicillin allergy?") not in keys  # its summary there
    counts = source_counts(texts)
    assert list(counts) == ["medquad", "meqsum", "healthcaremagic", "chq_summ", "rqe", "mqp", "quebec"]
    assert counts["medquad"] == 30
    assert counts["meqsum"] == 4 + 4  # CHQs and their summaries, once
    assert counts["healthcaremagic"] == 4  # its summaries are MeQSum's
    assert counts["rqe"] == 20
    assert counts["quebec"] == len(quebec_query_split(data_root=data_root)[0]) + 1  # held-out queries left out
    assert counts["mqp"] == 20 + 1  # "What are the symptoms of gout ?" belongs to MedQuAD
    train, dev = split_texts(texts, 40, 0.25, seed=3)
    assert (len(train), len(dev)) == (30, 10) and not {t.text for t in train} & {t.text for t in dev}
    assert split_texts(texts, 40, 0.25, seed=3) == (train, dev)


class CountingTeacher:
    """A stand-in teacher: hashed unit vectors; stops (KeyboardInterrupt) on encode call number `stop_at`."""

    name, dim, backend, fingerprint = "counting", 8, "onnx", "f" * 64

    def __init__(self, stop_at: int | None = None) -> None:
        self.calls, self.stop_at = 0, stop_at

    def encode(self, texts: list[str], progress: bool = False) -> np.ndarray:
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        seeds = [int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) for text in texts]
        vectors = np.stack([np.random.default_rng(seed).normal(size=self.dim) for seed in seeds]).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_teacher_vectors_resume_after_a_stop_and_are_read_back(tmp_path, monkeypatch):
    monkeypatch.setattr(chunked_encoding, "ENCODE_CHUNK", 2)
    texts = [SourceText(f"question {i}?", "medquad") for i in range(9)]  # 5 chunks
    cache = teacher_cache_dir(tmp_path / "student")
    assert cache == tmp_path / "student.teacher"
    with pytest.raises(KeyboardInterrupt):
        teacher_vectors(CountingTeacher(stop_at=4), texts, cache, progress=False)
    assert not (cache / TEACHER_VECTORS).exists()

    resumed = CountingTeacher()
    vectors = teacher_vectors(resumed, texts, cache, progress=False)
    assert resumed.calls == 2  # the 3 chunks encoded before the stop are kept
    np.testing.assert_allclose(vectors, CountingTeacher().encode([t.text for t in texts]), atol=1e-6)
    assert [json.loads(line)["text"] for line in (cache / "texts.jsonl").open()] == [t.text for t in texts]
    assert json.loads((cache / "teacher.json").read_text())["fingerprint"] == "f" * 64

    again = CountingTeacher()
    np.testing.assert_array_equal(teacher_vectors(again, texts, cache, progress=False), vectors)
    assert again.calls == 0
    other = CountingTeacher()
    teacher_vectors(other, texts[:4], cache, progress=False)  # other texts: encoded again
    assert other.calls == 2


def test_a_student_learns_its_teacher_saves_and_indexes_on_onnx(
    data_root, tiny_teacher_dir, tiny_encoder_dir, tmp_path, monkeypatch
):
    from medfaq.index.encoder import Encoder
    from medfaq.index.faq_index import FaqIndex
    from medfaq.retriever.biencoder.student_config import StudentTrainConfig
    from medfaq.retriever.training.config import EncoderTrainConfig
    from medfaq.retriever.training.pair_models import model_type_of

    out = tmp_path / "student"
    command = [
        *("train", "student", "--teacher", tiny_teacher_dir, "--init", tiny_encoder_dir, "--out", out),
        *("--data-root", data_root, "--teacher-backend", "onnx", "--dev-fraction", "0.2", "--epochs", "3"),
        *("--batch-size", "8", "--lr", "1e-3", "--seed", "1", "--teacher-space", "projection"),
    ]
    result = medfaq(*command)
    assert result.exit_code == 0, result.output
    config = StudentTrainConfig.load(out)
    assert (
        config.dev_after["mse"] < config.dev_before["mse"] and config.dev_after["cosine"] > config.dev_before["cosine"]
    )
    assert "MSE to the teacher" in result.stdout
    assert config.projection == [32, 48] and config.teacher_backend == "onnx" and config.seed == 1
    assert config.teacher_fingerprint == Encoder(str(tiny_teacher_dir), device="cpu").fingerprint
    assert sum(config.text_counts.values()) == config.n_train_pairs + config.n_dev_texts
    assert config.n_train_pairs + config.n_dev_texts == len(distillation_texts(data_root))
    student = Encoder(str(out), device="cpu")
    assert student.dim == 48 and student.fingerprint == config.fingerprint
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert model_type_of(out) == "biencoder" and EncoderTrainConfig.load(out).task == "distill"

    def no_encoding(*args, **kwargs):
        raise AssertionError("the teacher's vectors are cached")

    with monkeypatch.context() as patch:
        patch.setattr(chunked_encoding, "encode_chunks", no_encoding)
        again = medfaq(*command, "--force")
    assert again.exit_code == 0, again.output
    assert StudentTrainConfig.load(out).fingerprint == config.fingerprint  # seeded: the same student

    faqs = write_jsonl(tmp_path / "faqs.jsonl", [{"id": t, "question": f"What is {t}?"} for t in TOPICS])
    built = medfaq("index", "build", faqs, "--out", tmp_path / "idx", "--encoder", out, "--encoder-backend", "onnx")
    assert built.exit_code == 0, built.output
    index = FaqIndex.load(tmp_path / "idx")
    encoder = index.open_encoder("onnx")  # `auto` may pick bf16 weights on an AMX CPU
    assert index.manifest.dimension == 48 and index.manifest.encoder_backend == encoder.backend == "onnx"
    onnx_vectors = encoder.encode(["What is gout?"])
    np.testing.assert_allclose(onnx_vectors, student.encode(["What is gout?"]), atol=1e-4)  # the Dense is exported


def test_the_aligned_teacher_map_recovers_a_teacher_that_is_the_student_turned(tiny_encoder_dir):
    """A teacher whose vectors are the student's, turned and embedded in a wider space: the map brings them back
    onto the student's exactly, keeping all of the teacher."""
    from medfaq.retriever.biencoder.distill import aligned_teacher_map, build_student, unit_rows

    student = build_student(str(tiny_encoder_dir), None, "cpu")
    texts = [f"What {kind} {topic} ?" for topic in TOPICS for kind in ("causes", "is", "treats", "prevents")]
    own = student.encode(texts, convert_to_numpy=True, normalize_embeddings=True)
    turn, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(48, own.shape[1])))  # orthonormal columns
    teacher = own @ turn.T  # 48 wide, unit rows, the student's cosines
    mapping, kept = aligned_teacher_map(student, texts, teacher, sample=len(texts))
    assert mapping.shape == (48, own.shape[1]) and kept == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(unit_rows(teacher @ mapping), own, atol=1e-4)


def test_an_aligned_student_keeps_its_width_and_learns(data_root, tiny_teacher_dir, tiny_encoder_dir, tmp_path):
    from medfaq.index.encoder import Encoder
    from medfaq.retriever.biencoder.student_config import StudentTrainConfig

    out = tmp_path / "student"
    result = medfaq(
        *("train", "student", "--teacher", tiny_teacher_dir, "--init", tiny_encoder_dir, "--out", out),
        *("--data-root", data_root, "--teacher-backend", "onnx", "--dev-fraction", "0.2", "--epochs", "3"),
        *("--batch-size", "8", "--lr", "1e-3", "--seed", "1"),
    )
    assert result.exit_code == 0, result.output
    config = StudentTrainConfig.load(out)
    assert config.teacher_space == "aligned" and config.projection == [] and 0 < config.teacher_variance_kept <= 1
    assert config.dev_after["mse"] < config.dev_before["mse"]
    assert Encoder(str(out), device="cpu").dim == 32  # no layer added: the index stores the student's width


def test_too_few_texts_for_the_aligned_space_fail_before_the_teacher_encodes(
    data_root, tiny_teacher_dir, tiny_encoder_dir, tmp_path
):
    out = tmp_path / "student"
    result = medfaq(
        *("train", "student", "--teacher", tiny_teacher_dir, "--init", tiny_encoder_dir, "--out", out),
        *("--data-root", data_root, "--max-texts", "16", "--teacher-backend", "onnx"),
    )
    assert_one_line_error(result, "down to the student's 32 dimensions")
    assert "there are only 15: give --max-texts a larger number, or use --teacher-space projection" in result.stderr
    assert not out.exists() and not teacher_cache_dir(out).exists()  # the teacher encoded nothing


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        (("--dev-fraction", "0.9"), "Invalid value for '--dev-fraction'"),
        (("--max-texts", "1"), "Invalid value for '--max-texts'"),
        (("--lr", "0"), "lr must be a finite number above 0"),
        (("--teacher-backend", "gpu"), "unknown teacher backend 'gpu'"),
        (("--teacher-space", "pca"), "unknown teacher space 'pca'"),
        (("--init", "/nonexistent/student"), "/nonexistent/student"),
        (("--data-root", "/nonexistent/data", "--teacher", "minilm"), "not found"),  # a teacher that is installed
    ],
)
def test_bad_options_are_one_line_errors(options, pattern, tmp_path):
    assert_one_line_error(medfaq("train", "student", "--out", tmp_path / "s", *options), pattern)


def test_every_declared_setting_is_an_option_with_its_default_and_reaches_the_config(monkeypatch, tmp_path):
    from medfaq.app import cmd_train
    from medfaq.common.runtime import MedfaqError
    from medfaq.common.settings import declared_settings
    from medfaq.retriever.biencoder.student_config import StudentTrainConfig

    seen = []

    def recorded(**settings):
        seen.append(settings)
        raise MedfaqError("recorded")

    monkeypatch.setattr(cmd_train, "StudentTrainConfig", recorded)
    medfaq("train", "student", "--out", tmp_path / "s", "--epochs", 3, "--teacher-space", "projection")
    declared = declared_settings(StudentTrainConfig)
    defaults = {name: rule.default for name, rule in declared.items() if rule.flag and rule.default is not None}
    assert {"teacher", "init", "teacher_backend", "max_texts", "dev_fraction", "seed"} <= {
        name for name, rule in declared.items() if rule.flag
    }
    assert seen == [{**defaults, "epochs": 3, "teacher_space": "projection"}]


def test_a_full_out_directory_and_the_mse_loss_elsewhere_are_refused(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "file").write_text("x")
    assert_one_line_error(medfaq("train", "student", "--out", tmp_path / "s"), "pass --force")
    assert_one_line_error(medfaq("train", "biencoder", "--loss", "mse", "--out", tmp_path / "m"), "train student")
