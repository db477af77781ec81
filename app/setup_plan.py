"""The set-up recipe: how `medfaq setup` (and the demo's first run, and a command that finds a model missing)
trains each model of `retriever.trained_models`, and which of them the default pipeline uses.

This is the one place the set-up steps are listed: `app.cmd_setup`, `app.setup_state` (the demo) and the first-need
training of `app.cmd_setup.train_on_first_need` all read it. Each step states its wall time as measured on 2 CPU cores
shared with other jobs (docs/results.md), so the set-up can say up front how long it will take."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from medfaq.common.runtime import indexes_dir, medfaq_home, models_dir, resumable_run
from medfaq.index.datasets import FAQ_TRAINING_DATA
from medfaq.retriever.trained_models import (
    AUTO_ENCODER,
    BIENCODER_MODEL,
    FAQ_INDEX,
    MPNET_BIENCODER_MODEL,
    QUESTION_WRITER_MODEL,
    RANK_BENCHMARK,
    RANK_SPLIT,
    RERANKER_MODEL,
    SUMMARIZER_ECL_MODEL,
    SUMMARIZER_GEMMA_MODEL,
    SUMMARIZER_RANK_MODEL,
    choose_encoder,
    model_ready,
)


@dataclass(frozen=True)
class ModelStep:
    """One model to train: `commands` are ``medfaq`` argument lists, ``{out}`` standing for the model's directory
    and ``{biencoder}`` for the fine-tuned retrieval bi-encoder under the models directory; `data` the datasets
    they read (fetched first); `minutes` the measured wall time (of one seed, with `seeds`): on the reference machine
    of app.setup_speed for the default pipeline's steps; the others' were measured before the steps ran on every
    core, on other 2-core machines, some beside other jobs (upper bounds)."""

    key: str
    model: str
    title: str
    stage: str
    data: tuple[str, ...]
    commands: tuple[tuple[str, ...], ...]
    minutes: float
    measured: str
    slow: bool = False  # left out by ``medfaq setup --fast``
    seeds: tuple[int, ...] = ()  # the commands holding ``{seed}`` run once per seed, each into its `outputs` entry
    needs: tuple[str, ...] = ()  # the keys of the steps whose models its commands start from
    kind: str = "train"  # the kind of work its minutes scale with on another machine (app.setup_speed)

    def outputs(self, out: Path | None = None) -> list[Path]:
        """The model directories the step fills: `out` (default: its name under the models directory), and with
        several `seeds` one beside it per further seed (``NAME-seedN``)."""
        out = out or models_dir() / self.model
        return [out, *(out.with_name(f"{out.name}-seed{seed}") for seed in self.seeds[1:])]

    def ready(self, out: Path | None = None) -> bool:
        return all(map(model_ready, self.outputs(out)))

    def pending_minutes(self, out: Path | None = None) -> float:
        """The measured minutes of what is left to train (every seed not saved yet)."""
        return self.minutes * max(1, sum(not model_ready(path) for path in self.outputs(out)))

    def argv(self, out: Path | None = None, encoder: Path | None = None) -> list[list[str]]:
        """The commands, saving the model to `out` (default: its name under the models directory), a seed already
        saved left out; `encoder`: the retrieval encoder the set-up index gets (default: the best fine-tuned one
        saved, `choose_encoder`)."""
        where: dict[str, str | list[str]] = {**places(), "{out}": str(out or models_dir() / self.model)}
        if encoder is not None:
            where["{retrieval_encoder}"] = str(encoder)
        commands = []
        for command in self.commands:
            if "{seed}" not in command:
                commands.append(fill(command, where))
                continue
            for seed, directory in zip(self.seeds, self.outputs(out), strict=True):
                if not model_ready(directory):
                    commands.append(fill(command, {**where, "{out}": str(directory), "{seed}": str(seed)}))
        return [resuming(command) for command in commands]

    def shown(self, out: Path | None = None) -> str:
        return " && ".join("medfaq " + " ".join(command) for command in self.argv(out))


def fill(command: tuple[str, ...], where: dict[str, str | list[str]]) -> list[str]:
    """`command` with each placeholder replaced by what `where` says it stands for (a list: several arguments)."""
    filled: list[str] = []
    for part in command:
        value = where.get(part, part)
        filled.extend([value] if isinstance(value, str) else value)
    return filled


def step_environment() -> dict[str, str]:
    """The environment the set-up's commands run in: this one, with every core this process may use given to torch
    and ONNX Runtime (``OMP_NUM_THREADS``; a serving machine's lower setting would leave cores idle in batch work)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {**os.environ, "OMP_NUM_THREADS": str(cores)}


RESUMABLE_COMMANDS = (("train", "summarizer"), ("train", "question-writer"))  # they checkpoint and take --resume


def resuming(command: list[str]) -> list[str]:
    """`command` with ``--resume`` added where it trains into an ``--out`` that an interrupted run of it left with a
    checkpoint (so a set-up run again continues that run instead of failing on a non-empty directory)."""
    if tuple(command[:2]) not in RESUMABLE_COMMANDS or "--out" not in command:
        return command
    out = Path(command[command.index("--out") + 1])
    return [*command, "--resume"] if resumable_run(out) else command


BIENCODER = ModelStep(
    key="biencoder",
    model=BIENCODER_MODEL,
    title="Fine-tune the MiniLM bi-encoder on query -> FAQ pairs (quick preset)",
    stage="retrieve",
    data=FAQ_TRAINING_DATA,
    commands=(("train", "biencoder", "--task", "faq", "--preset", "quick", "--out", "{out}"),),
    minutes=48,
    measured="43 min wall, 29 CPU-minutes, beside 2-3 other jobs (docs/results.md, retrieval bi-encoder), then 3 min "
    "calibrating its abstention threshold (docs/results.md, abstention out of the box)",
)
MPNET_BIENCODER = ModelStep(
    key="biencoder-mpnet",
    model=MPNET_BIENCODER_MODEL,
    title="Fine-tune all-mpnet-base-v2 as the retrieval bi-encoder on the same pairs: the default encoder",
    stage="retrieve",
    data=FAQ_TRAINING_DATA,
    commands=(
        (
            "train",
            "biencoder",
            "--task",
            "faq",
            "--preset",
            "quick",
            "--init",
            "mpnet",
            "--length-buckets",
            "--out",
            "{out}",
        ),
    ),
    minutes=23.4,
    measured="23.4 min alone on the reference machine (app.setup_speed), both cores, bf16, batches bucketed by length: "
    "18 min 14 s for 215 steps (25 min 10 s mixed), the rest preparing pairs and negatives and calibrating the "
    "threshold; 9.9 GB peak with the freed memory handed back (22.7 GB before) (docs/experiments/setup.md, training "
    "that fits two cores)",
    slow=True,
)
SUMMARIZER_ECL = ModelStep(
    key="summarizer-ecl",
    model=SUMMARIZER_ECL_MODEL,
    title="Train the MiniLM ECL question summarizer (quick preset)",
    stage="rewrite",
    data=("meqsum",),
    commands=(("train", "summarizer", "--preset", "quick", "--out", "{out}"),),
    minutes=12,
    measured="12 CPU-minutes for 8 epochs (docs/results.md, quick summarizer preset)",
)
RERANKER = ModelStep(
    key="reranker",
    model=RERANKER_MODEL,
    title="Train the FAQ reranker as a correction of the index's bi-encoder (MiniLM cross-encoder, listwise)",
    stage="rerank",
    data=BIENCODER.data,
    commands=(
        tuple(
            "train crossencoder --task faq --preset quick --loss listwise --prior-scale 20 --negatives 7"
            " --negatives-encoder {retrieval_encoder} --init {biencoder} --max-pairs 8000 --max-length 256"
            " --batch-size 4 --force --out {out}".split()
        ),
    ),
    minutes=108,
    needs=("biencoder",),
    measured="108 min wall as a correction of fine-tuned MPNet beside other jobs on 2 cores: 26 min training, 82 min "
    "calibrating its threshold through the MPNet prior; 21 min as a correction of the MiniLM one (--fast) "
    "(docs/results.md, the reranker follows the encoder)",
)
SUMMARIZER_GEMMA = ModelStep(
    key="summarizer-gemma",
    model=SUMMARIZER_GEMMA_MODEL,
    title="Fine-tune the Gemma 3 270M question summarizer (quick preset)",
    stage="rewrite",
    data=("meqsum",),
    commands=(
        (
            "train",
            "summarizer",
            "--backbone",
            "gemma-3-270m",
            "--variant",
            "mle",
            "--preset",
            "quick",
            "--save-every-steps",
            "5",
            "--out",
            "{out}",
        ),
    ),
    minutes=45,
    measured="34 min wall on 2 shared cores (2 epochs, 100 steps; docs/results.md, Gemma summarizer); 7 min 42 s alone "
    "in bf16 on an AMX machine (docs/results.md, a fresh set-up of the MPNet pipeline)",
    slow=True,
)
QUESTION_WRITER = ModelStep(
    key="question-writer",
    model=QUESTION_WRITER_MODEL,
    title="Fine-tune the question writer `medfaq index adapt` uses (Gemma 3 270M, FAQ -> consumer questions)",
    stage="adapt",
    data=("meqsum", "healthcaremagic", "chq_summ", "rqe"),
    commands=(("train", "question-writer", "--out", "{out}"),),
    minutes=20,
    measured="19 min 43 s wall (120 steps of 8 pairs, 18 min training) beside a reranker's training on 2 cores "
    "(docs/results.md, medfaq learns your bank)",
    slow=True,
)
RANK_BENCHMARK_COMMANDS = (
    ("data", "make-benchmark", RANK_BENCHMARK, "--out", "{benchmark}", "--bank", "{faq_index}"),
    ("data", "split-benchmark", "{benchmark}", "--seed", "0"),
)
RANK_SEEDS = (0, 1, 2)
"""The rank model is trained with three seeds and the per-index decision keeps the one whose chosen setting ranks
first on the development questions: its gain over dense varied from +1.5 to +10.4 test R@1 with the seed alone (two
set-ups), and the one kept gained +9.0 to +10.4 for every three of six seeds of one set-up (docs/results.md, the rank
model over three seeds; a fresh set-up of the MPNet pipeline)."""
SUMMARIZER_RANK = ModelStep(
    key="summarizer-rank",
    model=SUMMARIZER_RANK_MODEL,
    title="Train the Gemma summarizer to rank the MedQuAD bank (variant rank on medquad-chq's training questions, "
    "three seeds)",
    stage="likelihood",
    data=("medquad", "meqsum", "rqe", "mediqa2021"),
    commands=(
        *RANK_BENCHMARK_COMMANDS,
        (
            *"train summarizer --variant rank --preset quick --epochs 1 --n-hard-negatives 0".split(),
            *"--retrieval-negatives 4 --save-every-steps 5 --backbone {gemma} --retrieval-index".split(),
            "{benchmark_index}",
            "--train-data",
            "{train_pairs}",
            "--out",
            "{out}",
            "--seed",
            "{seed}",
        ),
    ),
    seeds=RANK_SEEDS,
    needs=("summarizer-gemma",),
    minutes=13,
    measured="11 min 23 s, 11 min 41 s and 11 min 39 s wall per seed for the training on 2 cores (AMX, bf16), "
    "alone, since the candidates are scored in one packed pass (docs/results.md, the rank model over three seeds); "
    "the benchmark and its split take about a minute",
    slow=True,
)


@dataclass(frozen=True)
class IndexBuild:
    """How the set-up encodes the MedQuAD index (`FAQ_INDEX`) with one retrieval encoder: with which `synonyms`
    (chosen on medquad-chq's development part, docs/results.md) and in how many measured `minutes` (on the runtime
    `auto` picks on the machine the steps were timed on, app.setup_speed.REFERENCE)."""

    synonyms: str
    minutes: float
    kind: str = "encode"

    def argv(self, encoder: Path, out: Path) -> tuple[str, ...]:
        return ("index", "build", "medquad", "--encoder", str(encoder), "--synonyms", self.synonyms, "--out", str(out))


FAQ_INDEX_BUILDS = {
    BIENCODER_MODEL: IndexBuild("medquad", 14),  # 13 min 59 s on one core beside a job
    # 11 min 32 s alone; synonyms lost development R@1 (69.8 -> 69.1); 10 min 32 s in bf16 on a slower day, when ONNX
    # Runtime encoded a sample 3.0 times slower than bf16 (docs/results.md, the encoder in bf16); 2 min 40 s in bf16
    # alone on another AMX machine (docs/results.md, a fresh set-up of the MPNet pipeline), 3 min 48 s on a third
    # on the reference machine (app.setup_speed), both cores, bf16: 3 min 48 s, twice (docs/experiments/setup.md)
    MPNET_BIENCODER_MODEL: IndexBuild("none", 3.8),
}
"""The MedQuAD index's build per retrieval encoder (docs/results.md, index build speed, and "Set-up ships the
chosen encoder")."""


MODEL_STEPS = (
    BIENCODER,
    MPNET_BIENCODER,
    SUMMARIZER_ECL,
    RERANKER,
    QUESTION_WRITER,
    SUMMARIZER_GEMMA,
    SUMMARIZER_RANK,
)
"""In the order they are trained: the retrieval encoders first (the MedQuAD index is encoded by the last one the
set-up trains), then the optional stages and the question writer, the quick ones before the slow Gemma summarizers
(the rank model continues the first)."""


def places() -> dict[str, str | list[str]]:
    """What the set-up commands' placeholders stand for."""
    benchmark = medfaq_home() / "benchmarks" / RANK_BENCHMARK
    split = benchmark / RANK_SPLIT
    return {
        "{biencoder}": str(models_dir() / BIENCODER_MODEL),
        "{retrieval_encoder}": choose_encoder(AUTO_ENCODER),
        "{gemma}": str(models_dir() / SUMMARIZER_GEMMA.model),
        "{faq_index}": str(indexes_dir() / FAQ_INDEX),
        "{benchmark}": str(benchmark),
        "{benchmark_index}": str(benchmark / "index"),
        "{train_pairs}": str(split / "train" / "pairs.jsonl"),
    }


DEFAULT_PIPELINE_MODELS = (MPNET_BIENCODER_MODEL,)
"""What the default pipeline uses, decided on real FAQ banks (docs/results.md): dense search with fine-tuned MPNet,
no summarizer, no reranker, no likelihood stage. ``medfaq setup`` trains these and nothing else; every other model
is trained by the command that needs it (`setup --all` trains them all up front)."""
FAST_PIPELINE_MODELS = (BIENCODER_MODEL,)  # ``medfaq setup --fast``: the fine-tuned MiniLM instead of MPNet


def steps_for(fast: bool = False, everything: bool = False) -> list[ModelStep]:
    """The model steps of ``medfaq setup``: the default pipeline's models (`fast`: the fine-tuned MiniLM instead of
    MPNet); with `everything`, every model the commands can use (without the slow ones when `fast`)."""
    if everything:
        return [step for step in MODEL_STEPS if not (fast and step.slow)]
    wanted = FAST_PIPELINE_MODELS if fast else DEFAULT_PIPELINE_MODELS
    return [step for step in MODEL_STEPS if step.model in wanted]


def left_out(fast: bool = False, everything: bool = False) -> list[ModelStep]:
    """The model steps `steps_for` leaves out: trained by the commands that need them, on first need."""
    kept = steps_for(fast, everything)
    return [step for step in MODEL_STEPS if step not in kept]


def saved_models() -> list[Path]:
    """The model directories of every set-up step (each seed) that are saved, in the order the set-up trains them:
    the models the default pipeline, `index adapt` and the MedQuAD index's decisions use (`medfaq models export`)."""
    return [path for step in MODEL_STEPS for path in step.outputs() if model_ready(path)]


def step_of(model: str) -> ModelStep | None:
    """The set-up step that trains the model named `model` (None: not a set-up model)."""
    return next((step for step in MODEL_STEPS if model == step.model), None)
