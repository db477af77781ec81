"""The ONNX Runtime encoder: the same vectors and fingerprint as PyTorch, a cached export redone when the model
changes, backend choice, and a dense search that imports no torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from medfaq.common.runtime import MedfaqError
from medfaq.index.encoder import Encoder, load_encoder, resolve_backend
from medfaq.index.onnx.encoder import OnnxEncoder
from medfaq.index.onnx.graph import EXPORT_DIR, EXPORT_INFO, GRAPHS, export_location

REPO = Path(__file__).resolve().parents[1]
TEXTS = [
    "Can I drink alcohol while taking amoxicillin?",
    "  WHAT causes   migraine?? ",
    "",
    "什么是糖尿病 😀",
    "shingles " * 200,  # longer than the model's 64 tokens
    "How is shingles treated?",
]
HEAVY = ("torch", "transformers", "sentence_transformers")
UNUSED_BY_DENSE = ("bm25s", "scipy")  # BM25 loads only when a search or a change needs it


@pytest.fixture(scope="module")
def exported_dir(tmp_path_factory, tiny_encoder_dir) -> Path:
    """A copy of the tiny sentence-transformers model with its ONNX export made inside it."""
    model = tmp_path_factory.mktemp("onnx_model") / "tiny"
    shutil.copytree(tiny_encoder_dir, model)
    OnnxEncoder(str(model))
    return model


def test_onnx_vectors_and_fingerprint_equal_pytorch(exported_dir, tiny_encoder):
    onnx = OnnxEncoder(str(exported_dir))
    torch_vectors = tiny_encoder.encode(TEXTS)
    vectors = onnx.encode(TEXTS)
    assert vectors.dtype == np.float32 and vectors.shape == torch_vectors.shape
    np.testing.assert_allclose(vectors, torch_vectors, atol=1e-5)
    assert onnx.fingerprint == tiny_encoder.fingerprint and onnx.dim == tiny_encoder.dim
    assert onnx.max_seq_length == tiny_encoder.max_seq_length == 64
    assert export_location(str(exported_dir)) == exported_dir / EXPORT_DIR  # beside the model it was made from
    int8 = OnnxEncoder(str(exported_dir), precision="int8")
    assert int8.fingerprint == onnx.fingerprint and int8.backend == "onnx-int8"
    cosines = np.einsum("ij,ij->i", int8.encode(TEXTS), torch_vectors)
    assert cosines.min() > 0.9, cosines


def test_pytorch_encoder_gives_sentence_transformers_vectors(tiny_encoder):
    expected = tiny_encoder.model.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(tiny_encoder.encode(TEXTS), expected, atol=1e-6)
    assert tiny_encoder.encode([]).shape == (0, tiny_encoder.dim)


def test_bf16_weights_keep_the_vectors_and_the_fp32_fingerprint(tiny_encoder_dir, tiny_encoder):
    bf16 = Encoder(str(tiny_encoder_dir), device="cpu", precision="bf16")
    assert bf16.backend == "torch-bf16" and bf16.fingerprint == tiny_encoder.fingerprint
    assert bf16.check["passed"] and bf16.check["backend"] == "torch-bf16" and bf16.check["min_cosine"] >= 0.95
    cosines = np.einsum("ij,ij->i", bf16.encode(TEXTS), tiny_encoder.encode(TEXTS))
    assert cosines.min() > 0.99, cosines


def test_bf16_weights_that_disagree_are_refused_and_auto_runs_onnx(monkeypatch, exported_dir):
    import medfaq.index.encoder as encoder_module
    import medfaq.index.onnx.check as check

    monkeypatch.setattr(check, "MIN_COSINE", 1.01)  # no cast model can pass
    with pytest.raises(MedfaqError, match="bf16 encoder .* disagrees with its fp32 source .*min cosine"):
        load_encoder(str(exported_dir), "torch-bf16", device="cpu")
    monkeypatch.setattr(encoder_module, "resolve_precision", lambda precision, device: "bf16")
    assert load_encoder(str(exported_dir), "auto", device="cpu").backend == "onnx"


def test_export_is_reused_and_redone_when_the_model_changes(exported_dir):
    info = exported_dir / EXPORT_DIR / EXPORT_INFO
    made = info.stat().st_mtime_ns
    OnnxEncoder(str(exported_dir))
    assert info.stat().st_mtime_ns == made  # loaded, not exported again
    weights = exported_dir / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    OnnxEncoder(str(exported_dir))
    assert info.stat().st_mtime_ns != made
    assert json.loads(info.read_text())["source"]["model.safetensors"][1] == weights.stat().st_mtime_ns


def test_a_model_in_an_installed_package_exports_into_the_cache(tmp_path):
    installed = tmp_path / "site-packages" / "some_model"
    installed.mkdir(parents=True)
    assert Path(os.environ["MEDFAQ_HOME"]) / "models" / "onnx" in export_location(str(installed)).parents


@pytest.mark.parametrize(
    ("measured", "one_question", "expected"),
    [("fp32", False, "onnx"), ("bf16", False, "torch-bf16"), ("bf16", True, "onnx")],
)
def test_backend_choice(monkeypatch, measured, one_question, expected):
    """`auto` on a CPU: bf16 weights where this CPU measures bf16 fast, except for a one-question search."""
    import medfaq.index.encoder as encoder_module

    monkeypatch.setattr(encoder_module, "resolve_precision", lambda precision, device: measured)
    monkeypatch.setitem(encoder_module._process, "one_question", one_question)
    assert resolve_backend("auto", "cpu") == expected
    assert resolve_backend("auto", "cuda") == "torch"
    assert resolve_backend("torch-bf16", "cuda") == "torch-bf16"
    assert resolve_backend("onnx-int8") == "onnx-int8"
    with pytest.raises(MedfaqError, match="run on the CPU"):
        resolve_backend("onnx", "cuda")
    with pytest.raises(MedfaqError, match="unknown encoder backend"):
        resolve_backend("tensorrt")


def test_index_built_with_pytorch_is_searched_with_onnx(tmp_path, exported_dir, faq_records):
    from medfaq.index.faq_index import FaqIndex

    built = FaqIndex.build(faq_records, load_encoder(str(exported_dir), "torch", device="cpu"), progress=False)
    built.save(tmp_path / "idx")
    assert built.manifest.encoder_backend == "torch"
    index = FaqIndex.load(tmp_path / "idx")
    assert index.open_encoder("onnx").backend == "onnx"  # the fingerprint check passed
    queries = [record.question for record in faq_records]
    assert [hits[0][0] for hits in index.search_dense(queries, 3)] == [r.id for r in faq_records]


@pytest.mark.parametrize("backend", ["onnx", "torch", "torch-bf16"])
def test_searches_run_concurrently_on_every_encoder_backend(tmp_path, exported_dir, faq_records, backend):
    """ONNX Runtime, PyTorch (texts tokenized under a lock) and FAISS on CPU take concurrent searches, so the
    pipeline's retrieval holds no lock and threads searching at once each get the answer their question gets alone."""
    from concurrent.futures import ThreadPoolExecutor

    from medfaq.index.faq_index import FaqIndex
    from medfaq.retriever.model_cache import build_pipeline
    from medfaq.retriever.pipeline import PipelineConfig

    FaqIndex.build(faq_records, OnnxEncoder(str(exported_dir)), progress=False).save(tmp_path / "idx")
    index = FaqIndex.load(tmp_path / "idx")
    assert index.searches_concurrently(dense=False) and not index.searches_concurrently(dense=True)  # not loaded yet
    index.open_encoder(backend)
    pipeline = build_pipeline(index, PipelineConfig(entities=False, log_unanswered=False, top_k=4))
    assert index.searches_concurrently(dense=True)
    assert pipeline.timed("retrieve", {}).lock is None
    questions = [record.question for record in faq_records] * 8

    def ranking(question: str) -> list[tuple[str, float]]:
        return [(hit.id, hit.score) for hit in pipeline.run(question).hits]

    alone = [ranking(question) for question in questions]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(ranking, questions)) == alone


def test_dense_search_imports_no_torch(tmp_path, exported_dir, faq_jsonl):
    """A real `medfaq search` in a fresh process over an index built with the ONNX backend: no model library, and
    not BM25's either."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    index = tmp_path / "idx"
    build = [sys.executable, "-m", "medfaq.app", "index", "build", str(faq_jsonl), "--out", str(index)]
    build += ["--encoder", str(exported_dir), "--encoder-backend", "onnx", "--synonyms", "none"]
    subprocess.run(build, check=True, env=env, capture_output=True, cwd=tmp_path)
    probe = (
        "import sys\nfrom medfaq.app.cli import main\n"
        f"sys.argv = ['medfaq', 'search', 'Is shingles treated?', '--index', {str(index)!r}, '--mode', 'dense']\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
        f"print('heavy:', [name for name in {HEAVY + UNUSED_BY_DENSE!r} if name in sys.modules])\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "f3" in result.stdout and "heavy: []" in result.stdout, result.stdout


@pytest.mark.integration
def test_minilm_on_onnx_equals_pytorch():
    torch_encoder = Encoder("minilm", device="cpu")
    expected = torch_encoder.encode(TEXTS)
    onnx = load_encoder("minilm", "onnx")
    np.testing.assert_allclose(onnx.encode(TEXTS), expected, atol=1e-5)
    assert onnx.fingerprint == torch_encoder.fingerprint
    cosines = np.einsum("ij,ij->i", load_encoder("minilm", "onnx-int8").encode(TEXTS), expected)
    assert cosines.min() > 0.97, cosines


def test_backend_comparison_reports_each_backend(tmp_path, exported_dir):
    from experiments.encoder_backends import compare_backends, format_table
    from medfaq.eval.benchmarks import Benchmark

    corpus = [{"_id": f"d{i}", "title": "", "text": text} for i, text in enumerate(TEXTS[:2] + TEXTS[5:])]
    queries = [{"_id": f"q{i}", "text": row["text"], "metadata": {}} for i, row in enumerate(corpus)]
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(len(corpus))}
    Benchmark("tiny", corpus, queries, qrels).save(tmp_path / "bench")
    report = compare_backends(str(exported_dir), tmp_path / "bench", ["onnx", "onnx-int8", "openvino"])
    rows = report["backends"]
    assert set(rows) == {"onnx", "onnx-int8", "openvino"}
    assert rows["onnx"]["recall@1"] == 100.0 and rows["onnx"]["corpus_texts_per_s"] > 0
    assert rows["openvino"]["recall@1"] == 100.0 and rows["openvino"]["min_cosine_to_first"] > 0.9999  # same graph
    assert rows["openvino"]["check_min_cosine"] > 0.9999 and "check_min_cosine" not in rows["onnx"]
    assert rows["onnx-int8"]["check_min_cosine"] >= 0.95 and report["int8_settings"]["onnx-int8"] == "per-channel"
    assert "| onnx-int8 |" in format_table(report) and "check min cos" in format_table(report)


def test_a_graph_without_prepacked_weights_gives_the_same_vectors(exported_dir):
    from medfaq.index.onnx.graph import session_options, set_weight_prepacking

    packed = OnnxEncoder(str(exported_dir)).encode(TEXTS)
    set_weight_prepacking(False)
    try:
        assert session_options().get_session_config_entry("session.disable_prepacking") == "1"
        unpacked = OnnxEncoder(str(exported_dir))
    finally:
        set_weight_prepacking(True)
    np.testing.assert_allclose(unpacked.encode(TEXTS), packed, atol=1e-6)


@pytest.fixture
def fresh_model(tmp_path, tiny_encoder_dir) -> Path:
    """A copy of the tiny model without an ONNX export."""
    model = tmp_path / "tiny"
    shutil.copytree(tiny_encoder_dir, model, ignore=shutil.ignore_patterns(f"{EXPORT_DIR}*"))
    return model


def built_on_pytorch(fresh_model: Path, faq_jsonl: Path, out: Path):
    """`medfaq index build` of the six FAQs with `fresh_model` on PyTorch, which needs no export to encode."""
    from typer.testing import CliRunner

    from medfaq.app.cli import app

    command = ["index", "build", str(faq_jsonl), "--out", str(out), "--encoder", str(fresh_model)]
    result = CliRunner().invoke(app, [*command, "--encoder-backend", "torch"])
    assert result.exit_code == 0, result.output
    return result


def test_index_build_exports_the_encoder_for_its_searches_and_int8_only_when_asked(tmp_path, fresh_model, faq_jsonl):
    built = built_on_pytorch(fresh_model, faq_jsonl, tmp_path / "idx")
    assert f"exporting {fresh_model} to ONNX Runtime, once" in built.stderr  # the build's progress line
    export = fresh_model / EXPORT_DIR
    assert (export / GRAPHS["fp32"]).is_file() and not (export / GRAPHS["int8"]).exists()
    assert "int8" not in json.loads((export / EXPORT_INFO).read_text())["checks"]
    OnnxEncoder(str(fresh_model), precision="int8")  # asked for: made and checked now
    assert (export / GRAPHS["int8"]).is_file() and json.loads((export / EXPORT_INFO).read_text())["checks"]["int8"]


def test_a_search_that_still_has_to_export_the_encoder_says_so_in_one_line(tmp_path, fresh_model, faq_jsonl):
    from typer.testing import CliRunner

    from medfaq.app.cli import app

    built_on_pytorch(fresh_model, faq_jsonl, tmp_path / "idx")
    shutil.rmtree(fresh_model / EXPORT_DIR, ignore_errors=True)  # as if the index had been built on a GPU machine
    search = ["search", "--index", str(tmp_path / "idx"), "--no-abstain", "How is shingles treated?"]
    result = CliRunner().invoke(app, search)
    assert result.exit_code == 0 and "f3" in result.stdout, result.output
    assert result.stderr.splitlines() == [
        f"warning: exporting {fresh_model} to ONNX Runtime, once (up to a minute or two)"
    ]
    assert CliRunner().invoke(app, search).stderr == ""  # exported once
