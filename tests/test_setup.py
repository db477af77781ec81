"""`medfaq setup --dry-run`: every step of the default pipeline with its measured time and command (`--all`: of every
set-up model); models already on disk are skipped, `--fast` fine-tunes MiniLM instead of MPNet (with `--all`, leaves
out the slow models); a command that needs a model set-up left out trains it on first need."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from medfaq.app.cli import app
from medfaq.app.setup_plan import MODEL_STEPS, SUMMARIZER_GEMMA, SUMMARIZER_RANK
from medfaq.common.runtime import CHECKPOINT_DIR, CHECKPOINT_STATE, UNFINISHED_FILE, indexes_dir, models_dir
from medfaq.retriever.trained_models import SET_UP_MODELS, model_ready


def dry_run(*flags: str) -> str:
    """The plan `medfaq setup --dry-run` prints: on stdout, so that it can be redirected to a file."""
    result = CliRunner().invoke(app, ["setup", "--dry-run", *flags])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    return result.stdout


def test_dry_run_all_lists_every_step_with_time_and_command():
    output = dry_run("--all")
    assert "9 step(s) to run" in output
    commands = ("index build medquad", "train biencoder --task faq", "train summarizer --preset quick")
    assert "train question-writer --out " + str(models_dir() / "question-writer") in output
    for command in (*commands, "train crossencoder --task faq"):
        assert command in output
    # fine-tuned MPNet, the encoder the rule chose, encodes the MedQuAD index
    mpnet = str(models_dir() / "biencoder-mpnet-faq-quick")
    assert f"--init mpnet --length-buckets --out {mpnet}" in output
    assert f"index build medquad --encoder {mpnet}" in output
    # the reranker starts from the MiniLM bi-encoder and is trained as a correction of the index's one (its prior)
    assert f"--prior-scale 20 --negatives 7 --negatives-encoder {mpnet} --init " in output
    assert "--backbone gemma-3-270m --variant mle" in output and "about 45 min" in output
    # the rank model continues the Gemma summarizer on medquad-chq's training part; then the index's decision
    rank = "--variant rank" in output and "--backbone " + str(models_dir() / "summarizer-gemma-quick") in output
    assert rank and "split-0/train/pairs.jsonl --out " + str(models_dir() / "summarizer-gemma-rank") in output
    # three seeds of it; no stage decision for the MedQuAD index: its real judgments are too few (docs/pipeline.md)
    seeds = [
        models_dir() / name for name in ("summarizer-gemma-rank", *(f"summarizer-gemma-rank-seed{s}" for s in (1, 2)))
    ]
    assert all(f"--out {path} --seed {seed}" in output for seed, path in enumerate(seeds)) and "about 39 min" in output
    assert "index likelihood " not in output and "index rerank " not in output


def test_present_models_are_skipped_and_fast_all_leaves_out_gemma():
    trained = models_dir() / "summarizer-ecl-quick"
    trained.mkdir(parents=True)
    (trained / "config.json").write_text("{}", encoding="utf-8")
    output, left = dry_run("--all", "--fast").split("left to the commands that need them")
    assert "4 step(s) to run" in output
    assert "gemma" not in output.lower() and "mpnet" not in output
    assert "summarizer-gemma-quick" in left and "question-writer" in left
    minilm = str(models_dir() / "biencoder-faq-quick")
    assert f"--negatives-encoder {minilm} --init {minilm}" in output  # the reranker corrects the MiniLM index
    assert "train summarizer --preset quick" not in output
    assert "index build medquad --encoder " + str(models_dir() / "biencoder-faq-quick") in output  # the MiniLM one


def test_the_demo_serves_the_fine_tuned_index_once_it_is_built(monkeypatch):
    from medfaq.app.setup_state import DemoSettings
    from medfaq.index.storage import MANIFEST

    monkeypatch.delenv("MEDFAQ_DEMO_INDEX", raising=False)
    settings = DemoSettings.from_env()
    assert settings.index_dir == indexes_dir() / "medquad-minilm"  # what the first step builds
    (indexes_dir() / "medquad-minilm").mkdir(parents=True)
    (indexes_dir() / "medquad-minilm" / MANIFEST).write_text("{}", encoding="utf-8")
    assert settings.index_dir.name == "medquad-minilm"
    (indexes_dir() / "medquad-faq").mkdir()
    (indexes_dir() / "medquad-faq" / MANIFEST).write_text("{}", encoding="utf-8")
    assert settings.index_dir.name == "medquad-faq"


def test_the_medquad_index_is_encoded_again_when_another_encoder_built_it(built_index, tiny_encoder_dir):
    import shutil

    mpnet = shutil.copytree(tiny_encoder_dir, models_dir() / "biencoder-mpnet-faq-quick")
    shutil.copytree(built_index, indexes_dir() / "medquad-faq")  # encoded by another encoder
    assert "Encode the MedQuAD index with the fine-tuned biencoder-mpnet-faq-quick" in dry_run()
    faqs = built_index.parent / "faqs.jsonl"
    command = ["index", "build", str(faqs), "--encoder", str(mpnet), "--out", str(indexes_dir() / "medquad-faq")]
    assert CliRunner().invoke(app, command).exit_code == 0
    output = dry_run()
    assert "Encode the MedQuAD index with the fine-tuned biencoder-mpnet-faq-quick: ready" in output
    assert "biencoder-mpnet-faq-quick: ready" in dry_run("--fast")  # --fast after a full set-up keeps MPNet


def test_the_reranker_is_trained_again_when_it_corrects_another_encoder_than_the_index(built_index, tiny_encoder_dir):
    import shutil

    from medfaq.retriever.training.config import EncoderTrainConfig

    mpnet = shutil.copytree(tiny_encoder_dir, models_dir() / "biencoder-mpnet-faq-quick")
    faqs = built_index.parent / "faqs.jsonl"
    command = ["index", "build", str(faqs), "--encoder", str(mpnet), "--out", str(indexes_dir() / "medquad-faq")]
    assert CliRunner().invoke(app, command).exit_code == 0
    reranker = models_dir() / "reranker-correction-quick"
    reranker.mkdir()
    (reranker / "config.json").write_text("{}", encoding="utf-8")
    minilm = models_dir() / "biencoder-faq-quick"
    EncoderTrainConfig(task="faq", prior_scale=20, negatives_encoder=str(minilm)).save(reranker)
    title = "Train the FAQ reranker as a correction of the index's bi-encoder (MiniLM cross-encoder, listwise)"
    assert f"{title}: about" in dry_run("--all")  # it corrects the MiniLM bi-encoder: trained again for MPNet's index
    EncoderTrainConfig(task="faq", prior_scale=20, negatives_encoder=str(mpnet)).save(reranker)
    assert f"{title}: ready" in dry_run("--all")


def test_the_dry_run_states_each_steps_time_on_this_machine_from_its_measured_speed():
    """A machine twice as slow to train and three times as slow to encode: each step's minutes scaled by its kind."""
    import json
    import re
    from dataclasses import asdict, replace

    from medfaq.app.setup_plan import FAQ_INDEX_BUILDS, MPNET_BIENCODER
    from medfaq.app.setup_speed import REFERENCE, SPEED_FILE, machine_name
    from medfaq.app.setup_state import INDEX_MINUTES
    from medfaq.common.runtime import medfaq_home
    from medfaq.retriever.trained_models import MPNET_BIENCODER_MODEL

    slower = replace(REFERENCE, train=2 * REFERENCE.train, encode=3 * REFERENCE.encode, machine=machine_name())
    medfaq_home().mkdir(parents=True)
    (medfaq_home() / SPEED_FILE).write_text(json.dumps(asdict(slower)), encoding="utf-8")
    minutes = [float(value) for value in re.findall(r"^\[\d+/\d+\] .*: about (\S+) min", dry_run(), re.M)]
    expected = [INDEX_MINUTES * 3, MPNET_BIENCODER.minutes * 2, FAQ_INDEX_BUILDS[MPNET_BIENCODER_MODEL].minutes * 3]
    assert minutes == [round(value, 1) for value in expected]
    assert "training x2.00 and encoding x3.00" in dry_run()


def test_this_machines_speed_is_timed_once_and_again_on_another_machine_or_by_other_probes(monkeypatch):
    import json

    import medfaq.app.setup_speed as setup_speed
    from medfaq.common.runtime import medfaq_home

    timed = []
    monkeypatch.setattr(setup_speed, "measure_speed", lambda: timed.append("timed") or (1.0, 0.1))
    first = setup_speed.speed_here()
    assert setup_speed.speed_here() == first and timed == ["timed"]
    assert first.factor("train") == 1.0 / setup_speed.REFERENCE.train
    monkeypatch.setattr(setup_speed, "machine_name", lambda: "another CPU")
    assert setup_speed.speed_here().machine == "another CPU" and len(timed) == 2
    (medfaq_home() / setup_speed.SPEED_FILE).write_text("{not json", encoding="utf-8")
    assert setup_speed.speed_here().machine == "another CPU" and len(timed) == 3
    older = {"train": 0.3, "encode": 0.04, "machine": "another CPU"}  # timed by the first probes, which had no version
    (medfaq_home() / setup_speed.SPEED_FILE).write_text(json.dumps(older), encoding="utf-8")
    assert setup_speed.speed_here().probes == setup_speed.PROBES and len(timed) == 4


@pytest.mark.speed_probes
def test_the_probes_time_real_work_on_the_real_minilm(minilm_dir):
    from medfaq.app.setup_speed import measure_speed

    train, encode = measure_speed()  # in a process of its own, on every core
    assert 0 < encode < 30 and 0 < train < 60


def _saved(directory, unfinished: bool = False, checkpoint: bool = False):
    """A model directory as a summarizer run leaves it: its best epoch saved, maybe unfinished, maybe resumable."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}", encoding="utf-8")
    if unfinished:
        (directory / UNFINISHED_FILE).touch()
    if checkpoint:
        (directory / CHECKPOINT_DIR).mkdir()
        (directory / CHECKPOINT_DIR / CHECKPOINT_STATE).write_bytes(b"state")
    return directory


def test_an_interrupted_training_is_resumed_and_a_saved_seed_is_kept():
    gemma = _saved(models_dir() / SUMMARIZER_GEMMA.model, unfinished=True, checkpoint=True)
    assert not model_ready(gemma)  # its first epoch is saved, but the run has not ended: not used, resumed
    seed0, seed1, seed2 = SUMMARIZER_RANK.outputs()
    _saved(seed0)
    _saved(seed2, unfinished=True)  # stopped before its first checkpoint: it starts again
    output = dry_run("--all")
    assert f"--variant mle --preset quick --save-every-steps 5 --out {gemma} --resume" in output
    assert f"--out {seed0} --seed 0" not in output  # a seed already trained is kept
    assert f"--out {seed1} --seed 1" in output
    assert f"--out {seed2} --seed 2" in output and f"--out {seed2} --seed 2 --resume" not in output
    assert "three seeds): about 26 min" in output
    _saved(seed1)
    (seed2 / UNFINISHED_FILE).unlink()
    assert "three seeds): ready" in dry_run("--all")


def test_the_recipe_trains_every_model_the_search_path_knows_by_name_and_no_other():
    assert sorted(step.model for step in MODEL_STEPS) == sorted(SET_UP_MODELS)


def test_set_up_trains_only_what_the_default_pipeline_uses():
    output = dry_run()
    assert "3 step(s) to run" in output  # the stock index, fine-tuned MPNet, the MedQuAD index it encodes
    assert "--init mpnet" in output and "summarizer" not in output.split("left to the commands")[0]
    assert "train crossencoder" not in output and "question-writer --out" not in output
    assert "index likelihood" not in output and "index rerank" not in output
    left = output.rstrip().splitlines()[-1]
    assert left.startswith("left to the commands that need them (or `medfaq setup --all`): biencoder-faq-quick")
    fast = dry_run("--fast")
    assert "mpnet" not in fast.split("left to the commands")[0] and "train biencoder --task faq" in fast


def test_a_command_trains_a_missing_model_on_first_need_after_saying_so(index_dir, monkeypatch):
    import typer

    import medfaq.app.cmd_setup as cmd_setup

    ran: list[list[str]] = []
    monkeypatch.setattr(cmd_setup, "run_steps", lambda steps: ran.append([step.key for step in steps]))
    search = ["search", "--index", str(index_dir), "--rerank", "how is achalasia treated"]
    refused = CliRunner().invoke(app, search)  # no terminal to ask at, no --yes: the one-line error, nothing trained
    assert refused.exit_code == 2 and not ran
    assert refused.stderr.startswith("error: no reranker model 'reranker-correction-quick' is trained yet")
    assert "`medfaq --yes ...`" in refused.stderr and refused.stderr.rstrip().endswith("takes about 156 min")
    assert len(refused.stderr.splitlines()) == 1
    agreed = CliRunner().invoke(app, ["--yes", *search])
    assert ran == [["biencoder", "reranker"]]  # the reranker starts from the fine-tuned MiniLM: trained first
    # the command ran again after the (faked) training, which saved nothing: the first error was not printed
    assert agreed.exit_code == 2 and agreed.stderr.count("error: no reranker model") == 1
    assert "reranker-correction-quick is not trained yet: Fine-tune the MiniLM bi-encoder" in agreed.stderr

    def failing(steps):  # a training that fails: its step said why in one line, and set-up exits with its code
        raise typer.Exit(7)

    monkeypatch.setattr(cmd_setup, "run_steps", failing)
    failed = CliRunner().invoke(app, ["--yes", *search])
    assert failed.exit_code == 7 and "Traceback" not in failed.output


def test_each_step_says_the_time_left_in_the_whole_set_up(monkeypatch, capsys):
    import subprocess

    from medfaq.app.cmd_setup import run_steps
    from medfaq.app.setup_state import SetupStep

    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: subprocess.CompletedProcess(args, 0))
    run_steps([SetupStep("a", "First", (("data", "list"),), minutes=5), SetupStep("b", "Second", (), minutes=52)])
    shown = capsys.readouterr().err
    assert "(1/2) First (about 5 min; 57 min left in all)" in shown
    assert "(2/2) Second (about 52 min; 52 min left in all)" in shown


def test_setup_model_trains_one_set_up_model_and_what_it_starts_from():
    planned = CliRunner().invoke(app, ["setup", "--model", "reranker-correction-quick", "--dry-run"])
    assert planned.exit_code == 0, planned.output
    steps = [line for line in planned.output.splitlines() if line.startswith("[")]
    assert [line.split("]")[0] for line in steps] == ["[1/2", "[2/2"]
    assert "MiniLM bi-encoder" in steps[0] and "FAQ reranker" in steps[1]
    assert "train crossencoder" in planned.output and "2 step(s) to run" in planned.output
    unknown = CliRunner().invoke(app, ["setup", "--model", "bert", "--dry-run"])
    assert unknown.exit_code == 2 and "no set-up model 'bert'; choose among" in unknown.output
    assert len(unknown.output.strip().splitlines()) == 1
