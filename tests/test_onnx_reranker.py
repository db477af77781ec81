"""The cross-encoder reranker on ONNX Runtime scores as PyTorch does (every head, a symmetric model, a prior
bi-encoder, query-side truncation, int8 where its check passed), and a reranked search then imports no model library."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from medfaq.common.runtime import MedfaqError
from medfaq.index.onnx.graph import ExportInfo
from medfaq.retriever.reranker.model import CrossEncoderReranker
from medfaq.retriever.reranker.onnx import OnnxReranker
from medfaq.retriever.reranker.training import train_crossencoder
from medfaq.retriever.training.config import make_config
from medfaq.retriever.training.pair_data import Pair
from medfaq.retriever.training.pair_models import save_trained
from tests.test_onnx_encoder import HEAVY

PAIRS = [
    Pair("Can I drink alcohol on amoxicillin?", "Is alcohol safe with antibiotics?", 1, "q1"),
    Pair("Can I drink alcohol on amoxicillin?", "What causes migraine headaches?", 0, "q1"),
    Pair("Is shingles contagious?", "Can I catch shingles from someone?", 1, "q2"),
    Pair("Is shingles contagious?", "How is type 2 diabetes treated?", 0, "q2"),
]
TEXTS = [(p.text_a, p.text_b) for p in PAIRS] + [
    ("my doctor said " * 40 + "is shingles contagious?", "Can I catch shingles?"),  # the query is cut
    ("Is shingles contagious?", "shingles " * 200),  # the FAQ is cut by the tokenizer
    ("什么是糖尿病 😀", ""),
]


def trained(tmp_path: Path, tiny_bert_dir: Path, task: str = "mqp", **settings) -> Path:
    """A tiny cross-encoder trained for one epoch and saved, as `medfaq train crossencoder` saves one."""
    base = {"init": str(tiny_bert_dir), "epochs": 1, "batch_size": 2, "lr": 1e-3, "dev_fraction": 0.0}
    config = make_config("crossencoder", task, "quick", **{"prior_scale": 0.0, **base, **settings})
    out = tmp_path / "reranker"
    save_trained(train_crossencoder(PAIRS, config, device="cpu"), config, out)
    return out


@pytest.mark.parametrize("head", ["cosine", "mean", "cls", "pooler"])
def test_onnx_scores_equal_pytorch_for_every_head(tmp_path, tiny_bert_dir, head):
    model = trained(tmp_path, tiny_bert_dir, head=head, symmetric=head == "cosine")
    expected = CrossEncoderReranker.load(model, device="cpu").score_pairs(TEXTS)
    onnx = OnnxReranker.load(model)
    np.testing.assert_allclose(onnx.score_pairs(TEXTS), expected, atol=1e-5)
    assert onnx.symmetric == (head == "cosine") and not onnx.corrects_first_stage
    assert (model / "medfaq-onnx" / "model.onnx").is_file()
    short = CrossEncoderReranker.load(model, device="cpu", max_length=12).score_pairs(TEXTS)
    np.testing.assert_allclose(OnnxReranker.load(model, max_length=12).score_pairs(TEXTS), short, atol=1e-5)
    assert "int8" not in ExportInfo.read(model / "medfaq-onnx").checks  # made when --quantize first asks for it
    try:
        quantized = OnnxReranker.load(model, quantize=True)
    except MedfaqError as error:  # a head trained on four pairs can rank the probe FAQs by noise that int8 reorders
        quantized, refusal = None, str(error)
    check = ExportInfo.read(model / "medfaq-onnx").checks["int8"]
    assert check["backend"] == "onnx-int8" and check["top1_changes"] >= 0 and "kendall_tau" in check
    if check["passed"]:
        np.testing.assert_allclose(quantized.score_pairs(TEXTS), expected, atol=0.05)
    else:
        assert quantized is None and re.search(r"int8 ONNX graph of reranker .* rerank without --quantize", refusal)


@pytest.fixture(scope="module")
def corrective_reranker(tmp_path_factory, tiny_bert_dir) -> Path:
    """A tiny reranker trained as a correction of a tiny bi-encoder, which it keeps in ``prior/``."""
    settings = {"loss": "listwise", "prior_scale": 20.0, "precision": "fp32", "negatives_encoder": str(tiny_bert_dir)}
    return trained(tmp_path_factory.mktemp("corrective"), tiny_bert_dir, task="faq", **settings)


def test_a_reranker_with_a_prior_scores_its_onnx_cosine_plus_the_onnx_logit(corrective_reranker):
    model = corrective_reranker
    torch_reranker = CrossEncoderReranker.load(model, device="cpu")
    onnx = OnnxReranker.load(model)
    assert onnx.corrects_first_stage and onnx.decision_boundary == torch_reranker.decision_boundary
    np.testing.assert_allclose(onnx.score_pairs(TEXTS), torch_reranker.score_pairs(TEXTS), atol=1e-5)
    assert (model / "prior" / "medfaq-onnx" / "model.onnx").is_file()


def test_a_reranked_search_imports_no_model_library(tmp_path, corrective_reranker, tiny_encoder_dir, faq_records):
    """A real `medfaq search --rerank` in a fresh process, the exports made beforehand."""
    from medfaq.index.faq_index import FaqIndex
    from medfaq.index.onnx.encoder import OnnxEncoder

    encoder = tmp_path / "encoder"
    shutil.copytree(tiny_encoder_dir, encoder)
    FaqIndex.build(faq_records, OnnxEncoder(str(encoder)), progress=False).save(tmp_path / "idx")
    OnnxReranker.load(corrective_reranker)
    args = ["search", "Is shingles treated?", "--index", str(tmp_path / "idx"), "--mode", "dense", "--rerank"]
    args += ["--reranker", str(corrective_reranker), "--json"]
    probe = (
        f"import sys\nfrom medfaq.app.cli import main\nsys.argv = ['medfaq', *{args!r}]\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
        f"print('heavy:', [name for name in {HEAVY!r} if name in sys.modules])\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    response, heavy = result.stdout.rsplit("heavy:", 1)
    assert heavy.strip() == "[]", result.stdout
    hits = json.loads(response)["hits"]
    assert len(hits) == 6 and all("rerank" in hit["stage_scores"] for hit in hits)
