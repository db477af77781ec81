"""`medfaq train summarizer` and `medfaq summarize` on a tiny random model and a tiny MeQSum-shaped data root."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from medfaq.app.cli import app
from tests.test_summarizer_training import PAIRS

runner = CliRunner()


def medfaq(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(result, pattern: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and pattern in lines[0], result.stderr


def assert_unfinished(result, out, command: str) -> None:
    """`result` is a run stopped by --max-steps: one line saying so and how to resume it, exit code 3."""
    assert result.exit_code == 3, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: training stopped before its end (--max-steps)"), result.stderr
    assert lines[-1].endswith(f"continue it with `medfaq train {command} --out {out} --resume`")
    assert "trained" not in result.stdout


def test_train_resume_and_summarize(tmp_path, tiny_bert_dir):
    root = tmp_path / "data" / "meqsum"
    root.mkdir(parents=True)
    for split, rows in (("train", PAIRS[:4]), ("valid", PAIRS[4:])):
        lines = [json.dumps({"id": i, "chq": c, "faq": f}) for i, (c, f) in enumerate(rows)]
        (root / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "model"
    common = ["--data-root", tmp_path / "data", "--out", out, "--max-source-len", 24, "--max-target-len", 12]
    common += ["--eval-max-length", 5, "--batch-size", 2, "--queue-size", 8, "--device", "cpu"]
    args = ["train", "summarizer", "--variant", "ecl-h", "--backbone", tiny_bert_dir, "--epochs", 2, *common]
    cut = medfaq(*args, "--max-steps", 2)
    assert_unfinished(cut, out, "summarizer")
    assert not (out / "history.json").exists() and (out / "last" / "trainer_state.pt").is_file()
    one_line_error(medfaq(*args), "not empty")
    resumed = medfaq(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    history = json.loads((out / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2] and history[-1]["step"] == 4
    assert json.loads((out / "train_config.json").read_text())["variant"] == "ecl-h"

    single = medfaq("summarize", "--model", out, "--max-length", 4, PAIRS[0][0])
    assert single.exit_code == 0 and len(single.stdout.splitlines()) == 1, single.output
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": "a", "chq": PAIRS[1][0]}) + "\n" + json.dumps({"question": "hi"}) + "\n")
    written = tmp_path / "out" / "s.jsonl"
    batch = medfaq("summarize", "--model", out, "--input", questions, "--output", written, "--num-beams", 2)
    assert batch.exit_code == 0, batch.output
    rows = [json.loads(line) for line in written.read_text().splitlines()]
    assert [r.get("id") for r in rows] == ["a", None] and all("summary" in r for r in rows)


def test_cli_errors_are_one_line(tmp_path):
    one_line_error(medfaq("train", "summarizer", "--variant", "nope", "--out", tmp_path / "x"), "unknown variant")
    one_line_error(medfaq("train", "summarizer", "--resume", "--out", tmp_path / "x"), "nothing to resume")
    one_line_error(medfaq("summarize", "--model", tmp_path), "give either a question or --input")
    one_line_error(medfaq("summarize", "--model", tmp_path, "hello"), "not a trained summarizer")
    nothing_set_up = "is trained yet: `medfaq setup --model summarizer-ecl-quick` trains it"
    one_line_error(medfaq("summarize", "hello"), nothing_set_up)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n')
    one_line_error(medfaq("summarize", "--input", bad, "--output", tmp_path / "o.jsonl"), "needs a text field")
    one_line_error(medfaq("summarize", "  "), "the question is empty")  # refused before any model loads
    for option in ("--num-beams", "--max-length", "--batch-size"):
        one_line_error(medfaq("summarize", option, 0, "hello"), f"Invalid value for '{option}'")
    bad.write_text('{"chq": "what is asthma"}\n{"chq": " "}\n')
    one_line_error(
        medfaq("summarize", "--input", bad, "--output", tmp_path / "o.jsonl"), "bad.jsonl:2: the question is empty"
    )


def tiny_training(tmp_path, backbone, variant: str, *options):
    """`medfaq train summarizer` of `variant` for one epoch on a tiny MeQSum-shaped data root (4 train pairs, 2
    valid) into ``tmp_path/model``."""
    root = tmp_path / "data" / "meqsum"
    root.mkdir(parents=True)
    for split, rows in (("train", PAIRS[:4]), ("valid", PAIRS[4:6])):
        (root / f"{split}.jsonl").write_text("".join(json.dumps({"chq": c, "faq": f}) + "\n" for c, f in rows))
    return medfaq(
        "train", "summarizer", "--variant", variant, "--backbone", backbone, "--epochs", 1, "--batch-size", 2,
        "--data-root", tmp_path / "data", "--out", tmp_path / "model", "--max-source-len", 24,
        "--max-target-len", 12, "--eval-max-length", 5, "--device", "cpu", *options,
    )  # fmt: skip


def test_train_data_spec_trains_on_the_named_splits_and_is_saved(tmp_path, tiny_bert_dir):
    out = tmp_path / "model"
    result = tiny_training(tmp_path, tiny_bert_dir, "mle", "--train-data", "meqsum:train+meqsum:valid")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "history.json").read_text())[-1]["step"] == 3  # 6 pairs in batches of 2
    assert json.loads((out / "train_config.json").read_text())["train_data"] == "meqsum:train+meqsum:valid"


def test_rank_options_reach_the_saved_config(tmp_path, tiny_bert_dir):
    result = tiny_training(
        tmp_path, tiny_bert_dir, "rank", "--rank-weight", 0.5, "--rank-prior", 0, "--rank-temperature", 2
    )
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "model" / "train_config.json").read_text())
    assert (saved["rank_weight"], saved["rank_prior"], saved["rank_temperature"]) == (0.5, 0.0, 2.0)
    assert "train_rank" in json.loads((tmp_path / "model" / "history.json").read_text())[-1]
    bad = tiny_training(tmp_path / "bad", tiny_bert_dir, "rank", "--rank-temperature", 0)
    one_line_error(bad, "Invalid value for '--rank-temperature': rank_temperature must be a finite number above 0")


def test_a_question_writer_stopped_by_max_steps_says_so_and_resumes(tmp_path, tiny_bert_dir):
    from medfaq.common.runtime import UNFINISHED_FILE

    root = tmp_path / "data" / "meqsum"
    root.mkdir(parents=True)
    for split, rows in (("train", PAIRS[:4]), ("valid", PAIRS[4:6])):
        (root / f"{split}.jsonl").write_text("".join(json.dumps({"chq": c, "faq": f}) + "\n" for c, f in rows))
    out = tmp_path / "writer"
    args = ["train", "question-writer", "--backbone", tiny_bert_dir, "--out", out, "--data-root", tmp_path / "data"]
    args += ["--train-data", "meqsum:train", "--max-pairs", 4, "--save-every-steps", 1]
    cut = medfaq(*args, "--max-steps", 1)
    assert_unfinished(cut, out, "question-writer")
    assert (out / UNFINISHED_FILE).is_file() and (out / "last" / "trainer_state.pt").is_file()
    resumed = medfaq(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert "trained the question writer" in resumed.stdout and not (out / UNFINISHED_FILE).exists()


def trained_config(monkeypatch, tmp_path, *options):
    """The config `medfaq train summarizer` with `options` hands its trainer (a stand-in that trains nothing)."""
    import medfaq.summarizer.training.trainer as trainer
    from medfaq.app import cmd_train

    configs = []

    class NoTraining:
        def __init__(self, config, out, resume=False):
            configs.append(config)

        def train(self, *args, **kwargs):
            return []

    monkeypatch.setattr(cmd_train, "_pairs", lambda spec, data_root: [("chq", "faq")])
    monkeypatch.setattr(trainer, "SummarizerTrainer", NoTraining)
    result = medfaq("train", "summarizer", "--out", tmp_path / "model", *options)
    assert result.exit_code == 0, result.output
    return configs[0]


def test_every_declared_setting_is_an_option_and_only_those_given_override_the_preset(monkeypatch, tmp_path):
    from typer.main import get_command

    from medfaq.common.settings import declared_settings
    from medfaq.summarizer.training.config import SummarizerTrainConfig, preset_config

    command = get_command(app).commands["train"].commands["summarizer"]
    spelled = {name for param in command.params for name in (*param.opts, *param.secondary_opts)}
    flags = [declared.flag for declared in declared_settings(SummarizerTrainConfig).values() if declared.flag]
    assert {"--retrieval-negatives", "--train-embeddings", "--lr", "--max-steps"} <= spelled
    assert all(set(flag.split("/")) <= spelled for flag in flags)

    given = ["--alpha", 0.5, "--train-embeddings", "--lora-rank", 2, "--retrieval-negatives", 0, "--threads", 1]
    config = trained_config(monkeypatch, tmp_path, "--preset", "full", "--variant", "mle", *given, "--device", "cpu")
    changes = {"alpha": 0.5, "freeze_embeddings": False, "lora_rank": 2, "threads": 1, "device": "cpu"}
    assert config == preset_config("full", "mle", **changes)


def test_a_value_a_declaration_refuses_is_a_usage_error_before_any_work(tmp_path):
    refused = [
        ("--batch-size", 0, "batch_size must be a whole number of at least 1"),
        ("--lr", "nan", "lr must be a finite number above 0"),
        ("--label-smoothing", 1.5, "label_smoothing must be a finite number of at least 0 and at most 1"),
        ("--precision", "half", "unknown precision 'half'"),
    ]
    for option, value, words in refused:
        result = medfaq("train", "summarizer", "--out", tmp_path / "x", option, value)
        one_line_error(result, f"Invalid value for '{option}': {words}")
    assert list(tmp_path.iterdir()) == []


def test_the_question_writer_takes_only_the_options_of_how_its_run_goes(tmp_path):
    writer = medfaq("train", "question-writer", "--out", tmp_path / "x", "--alpha", 0.5)
    assert writer.exit_code == 2 and "No such option: --alpha" in writer.stderr, writer.output
    one_line_error(
        medfaq("train", "question-writer", "--out", tmp_path / "x", "--threads", -1), "Invalid value for '--threads'"
    )
