"""Every derived ONNX graph is checked against its fp32 source before it is used: an int8 graph that disagrees is not
kept, asking for it is one `error:` line with the measured agreement and the backend that works, a graph checked on
another CPU is checked again where it runs, and an index records the check of the graph that encoded it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from medfaq.common.runtime import MedfaqError
from medfaq.index.onnx import export as onnx_export
from medfaq.index.onnx.check import PROBE_FAQS, PROBE_QUESTIONS, check_encoder, cpu_signature
from medfaq.index.onnx.encoder import OnnxEncoder
from medfaq.index.onnx.graph import EXPORT_DIR, EXPORT_INFO, GRAPHS, ExportInfo
from tests.test_cli_guards import medfaq

INT8 = "onnx-int8"


def scramble_int8_weights(graph: Path) -> None:
    """Replace every 8-bit weight of `graph` (the quantised matrices and embeddings) by random values: a graph that
    runs and answers noise."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(graph))
    rng = np.random.default_rng(0)
    for tensor in model.graph.initializer:
        if tensor.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8):
            weights = numpy_helper.to_array(tensor)
            info = np.iinfo(weights.dtype)
            noise = rng.integers(info.min, info.max, size=weights.shape, dtype=weights.dtype, endpoint=True)
            tensor.CopyFrom(numpy_helper.from_array(noise, tensor.name))
    onnx.save(model, str(graph))


def scramble_parameters(model) -> None:
    """What a broken PyTorch int8 conversion would leave: every weight random."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter))


@pytest.fixture
def model_copy(tmp_path, tiny_encoder_dir) -> Path:
    model = tmp_path / "tiny"
    shutil.copytree(tiny_encoder_dir, model, ignore=shutil.ignore_patterns(f"{EXPORT_DIR}*"))  # exported here anew
    return model


@pytest.fixture
def scrambling_quantizer(monkeypatch):
    """Every int8 graph the exporter makes answers noise."""
    original = onnx_export.quantize

    def quantize(fp32: Path, int8: Path, **options) -> None:
        original(fp32, int8, **options)
        scramble_int8_weights(int8)

    monkeypatch.setattr(onnx_export, "quantize", quantize)


def test_the_check_passes_a_faithful_copy_and_fails_noise():
    rng = np.random.default_rng(1)
    source = rng.normal(size=(len(PROBE_QUESTIONS) + len(PROBE_FAQS), 16)).astype(np.float32)
    source[len(PROBE_QUESTIONS) :] += source[: len(PROBE_QUESTIONS)] * 3  # each question near its FAQ
    source /= np.linalg.norm(source, axis=1, keepdims=True)
    close = source + rng.normal(scale=0.01, size=source.shape).astype(np.float32)
    close /= np.linalg.norm(close, axis=1, keepdims=True)
    noise = rng.normal(size=source.shape).astype(np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    passed = check_encoder("onnx-int8", source, close)
    failed = check_encoder("onnx-int8", source, noise)
    assert passed.passed and passed.min_cosine > 0.99 and passed.top1_changes == 0 and passed.kendall_tau > 0.9
    assert not failed.passed and failed.min_cosine < 0.5 and failed.top1_changes > 1
    assert "min cosine" in failed.describe() and "probe searches" in failed.describe()


def test_an_int8_graph_that_disagrees_is_not_kept_and_asking_for_it_is_one_error(model_copy, scrambling_quantizer):
    fp32 = OnnxEncoder(str(model_copy))  # the export: fp32 alone, no int8 graph until one is asked for
    export = model_copy / EXPORT_DIR
    assert "int8" not in ExportInfo.read(export).checks and fp32.check["max_difference_from_torch"] < 1e-4
    for _ in range(2):  # made (every int8 setting tried and refused) the first time, refused again the second
        with pytest.raises(MedfaqError, match=r"int8 ONNX graph of .*tiny disagrees with its fp32 source \(min cos"):
            OnnxEncoder(str(model_copy), precision="int8")
    assert not (export / GRAPHS["int8"]).exists() and (export / GRAPHS["fp32"]).is_file()
    check = ExportInfo.read(export).checks["int8"]
    assert check["passed"] is False and check["min_cosine"] < 0.95 and check["cpu"] == cpu_signature()
    assert check["setting"] == list(onnx_export.QUANTIZATION_SETTINGS)[-1]  # every setting was tried


def test_index_build_with_a_refused_int8_graph_is_one_error(tmp_path, model_copy, faq_jsonl, scrambling_quantizer):
    out = tmp_path / "idx"
    result = medfaq(
        "index", "build", faq_jsonl, "--out", out, "--encoder", model_copy, "--encoder-backend", "onnx-int8"
    )
    assert result.exit_code == 2 and not out.exists()
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "disagrees with its fp32 source (min cosine" in errors[0] and "--encoder-backend onnx (fp32)" in errors[0]


def test_an_index_records_the_check_of_the_graph_that_encoded_it(tmp_path, model_copy, faq_jsonl):
    out = tmp_path / "idx"
    result = medfaq(
        "index", "build", faq_jsonl, "--out", out, "--encoder", model_copy, "--encoder-backend", "onnx-int8"
    )
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["encoder_backend"] == "onnx-int8"
    check = manifest["encoder_check"]
    assert check["passed"] is True and check["backend"] == "onnx-int8" and check["min_cosine"] >= 0.95
    assert check["cpu"] == cpu_signature() and check["bounds"]["min_cosine"] == 0.95


def test_a_graph_checked_on_another_cpu_is_checked_again_here(model_copy):
    OnnxEncoder(str(model_copy), precision="int8")  # made and checked on this CPU
    export = model_copy / EXPORT_DIR
    info = json.loads((export / EXPORT_INFO).read_text())
    info["checks"]["int8"]["cpu"] = cpu_signature() + ",another_isa"  # as if made on a CPU with other int8 kernels
    (export / EXPORT_INFO).write_text(json.dumps(info))
    assert OnnxEncoder(str(model_copy), precision="int8").check["cpu"] == cpu_signature()  # passes here too
    graph = export / GRAPHS["int8"]
    data = graph.with_name(graph.name + ".data")
    import onnx

    model = onnx.load(str(graph))  # its weights inlined again, then scrambled: here it answers noise
    data.unlink()
    onnx.save(model, str(graph))
    scramble_int8_weights(graph)
    with pytest.raises(MedfaqError, match=r"disagrees with its fp32 source .* on x86_64"):
        OnnxEncoder(str(model_copy), precision="int8")


def test_a_pytorch_int8_reranker_that_disagrees_is_refused(tmp_path, tiny_bert_dir, monkeypatch):

    from medfaq.retriever.reranker import model as crossencoder
    from tests.test_onnx_reranker import trained

    model = trained(tmp_path, tiny_bert_dir, head="mean")

    monkeypatch.setattr(crossencoder, "quantize_linear", scramble_parameters)
    with pytest.raises(MedfaqError, match=r"int8 \(PyTorch dynamic\) reranker .* \(best FAQ changed in .* --quantize"):
        crossencoder.CrossEncoderReranker.load(model, quantize=True)


def test_activation_outliers_measures_each_layer(tiny_encoder_dir, capsys):
    from experiments.activation_outliers import PROJECTIONS, main, peak_over_mean

    ratios = peak_over_mean(str(tiny_encoder_dir))
    assert set(ratios) == set(PROJECTIONS) and all(len(row) == 2 and min(row) >= 1.0 for row in ratios.values())
    assert main(["--model", str(tiny_encoder_dir)]) == 0 and "| feed-forward output |" in capsys.readouterr().out


def test_a_pytorch_int8_bi_encoder_that_disagrees_is_refused(tiny_encoder_dir, monkeypatch):

    from medfaq.retriever.biencoder import scorer as biencoder

    assert biencoder.BiEncoderScorer.load(tiny_encoder_dir, quantize=True).encode(["What is asthma?"]).shape[0] == 1
    monkeypatch.setattr(biencoder, "quantize_linear", scramble_parameters)
    with pytest.raises(MedfaqError, match=r"int8 \(PyTorch dynamic\) bi-encoder .* disagrees .* --quantize"):
        biencoder.BiEncoderScorer.load(tiny_encoder_dir, quantize=True)
