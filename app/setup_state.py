"""What the demo runs on, and its first-run set-up: fetch MedQuAD, build the default index, train the quick models.

The set-up runs in one background thread per server; each step is a `medfaq ...` command run as a subprocess whose
latest output line is shown on the page. Search opens as soon as the index exists; the summarizer and the reranker
join when their models appear under ``models_dir()``.
"""

from __future__ import annotations

import codecs
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from medfaq.app.setup_plan import FAQ_INDEX_BUILDS, RERANKER, ModelStep, step_environment, steps_for
from medfaq.app.setup_speed import MachineSpeed, speed_here
from medfaq.common.runtime import MedfaqError, medfaq_home, models_dir
from medfaq.retriever.decisions.encoder_rule import stock_encoder
from medfaq.retriever.trained_models import (
    RETRIEVAL_ENCODERS,
    SUMMARIZERS,
    encoded_by,
    index_built,
    model_ready,
    reranker_corrects,
    set_up_index_dirs,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
OFF_VALUES = {"", "0", "off", "none", "false", "no"}
# fetching MedQuAD and `medfaq index build medquad --synonyms none` with stock MiniLM: 1.0 min on the reference
# machine, alone, on both cores (docs/experiments/setup.md, a fresh set-up timed against its dry run)
INDEX_MINUTES = 1.0
EXAMPLE_QUESTIONS = (
    "I've been on amoxicillin for a chest infection since Monday. Is it OK to have a glass of wine at my "
    "sister's wedding this weekend?",
    "My father was just diagnosed with Parkinson disease. Is it inherited, and could I get it too?",
    "I'm always thirsty and I pee a lot lately. Could these be early signs of type 2 diabetes?",
    "My mum has a painful rash on one side of her back. How is shingles treated and is there a vaccine?",
)
EXAMPLE_LABELS = ("Alcohol & amoxicillin", "Is Parkinson's inherited?", "Early signs of diabetes", "Shingles treatment")

ENV_INDEX = "MEDFAQ_DEMO_INDEX"
ENV_SUMMARIZER = "MEDFAQ_DEMO_SUMMARIZER"
ENV_RERANKER = "MEDFAQ_DEMO_RERANKER"
ENV_NO_TRAIN = "MEDFAQ_DEMO_NO_TRAIN"
ENV_DATA = "MEDFAQ_DEMO_DATA"


@dataclass(frozen=True)
class DemoSettings:
    """Where the demo's index and models are; every field can be set by an environment variable."""

    index_dirs: tuple[Path, ...]  # best first; the last is built by the first set-up step
    summarizers: tuple[Path, ...]
    reranker: Path | None
    train: bool
    shared_data: Path | None
    fast: bool = False
    everything: bool = False  # train every set-up model (`medfaq setup --all`), not only the default pipeline's

    @classmethod
    def from_env(cls, fast: bool = False, everything: bool = False) -> DemoSettings:
        """`MEDFAQ_DEMO_INDEX` (a directory), `MEDFAQ_DEMO_SUMMARIZER` / `MEDFAQ_DEMO_RERANKER` (a model directory,
        a name under ``models_dir()``, or ``none``; default: the set-up models), `MEDFAQ_DEMO_NO_TRAIN=1`,
        `MEDFAQ_DEMO_DATA` (a copy of the shared data, default ``../shared/data`` when present). `fast`: the
        fine-tuned MiniLM instead of MPNet (and, with `everything`, no slow model). Only the default index is built
        on first run: a `MEDFAQ_DEMO_INDEX` that holds no built index (a typo, say) is an error, not a 47,441-FAQ
        build."""
        data = os.environ.get(ENV_DATA)
        shared = Path(data).expanduser() if data else SHARED_DATA
        chosen = os.environ.get(ENV_SUMMARIZER)
        custom = os.environ.get(ENV_INDEX)
        if custom and not index_built(Path(custom).expanduser()):
            raise MedfaqError(
                f"{ENV_INDEX}={custom} holds no built index: build it first (`medfaq index build COLLECTION --out "
                f"{custom}`), or unset {ENV_INDEX} for the default index, which the demo builds itself"
            )
        rewriters = [step.model for step in steps_for(fast, everything=True) if step.stage == "rewrite"]
        names = [chosen] if chosen is not None else rewriters
        summarizers = sorted(filter(None, map(_model_path, names)), key=_summarizer_rank)
        return cls(
            index_dirs=(Path(custom).expanduser(),) if custom else set_up_index_dirs(),
            summarizers=tuple(summarizers),
            reranker=_model_path(os.environ.get(ENV_RERANKER, RERANKER.model)),
            train=os.environ.get(ENV_NO_TRAIN, "0").strip().lower() in OFF_VALUES,
            shared_data=shared if shared.is_dir() else None,
            fast=fast,
            everything=everything,
        )

    @property
    def summarizer(self) -> Path | None:
        """The best summarizer on disk (so the demo uses it while a better one trains), else the best wanted."""
        return next((path for path in self.summarizers if model_ready(path)), next(iter(self.summarizers), None))

    @property
    def index_dir(self) -> Path:
        """The best index on disk (the fine-tuned encoder's once it is built), else the one the set-up builds first."""
        return next((path for path in self.index_dirs if index_built(path)), self.index_dirs[-1])

    @property
    def faq_index_dir(self) -> Path | None:
        """Where the set-up builds the fine-tuned encoder's index (None when the index is set by the user)."""
        return self.index_dirs[0] if len(self.index_dirs) > 1 else None

    def index_ready(self) -> bool:
        return index_built(self.index_dir)

    def index_stamp(self) -> float:
        """Changes whenever the index is rebuilt or edited (cache key for the loaded index)."""
        from medfaq.index.storage import MANIFEST

        return (self.index_dir / MANIFEST).stat().st_mtime


def _summarizer_rank(path: Path) -> int:
    """Best first, as `SUMMARIZERS` orders them; other directories after them."""
    return SUMMARIZERS.index(path.name) if path.name in SUMMARIZERS else len(SUMMARIZERS)


def _model_path(value: str) -> Path | None:
    """A model directory: an existing path as given, else a name under ``models_dir()``; None when switched off."""
    if value.strip().lower() in OFF_VALUES:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() or path.exists() else models_dir() / value


@dataclass
class SetupStep:
    """One set-up step: `medfaq` commands run in order, and what the page shows about them."""

    key: str
    title: str
    commands: tuple[tuple[str, ...], ...] = ()
    model: Path | None = None  # the model directory the step must leave behind
    minutes: float = 0.0  # measured wall time (app.setup_plan)
    status: str = "pending"  # pending | running | done | failed | skipped
    detail: str = ""
    started: float | None = None
    finished: float | None = None

    @property
    def shown_command(self) -> str:
        return " && ".join("medfaq " + " ".join(command) for command in self.commands)

    def elapsed(self) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or time.time()) - self.started


def model_targets(settings: DemoSettings) -> list[tuple[ModelStep, Path | None]]:
    """Each set-up model step with the directory it must fill (None: switched off): summarizers by name, a
    summarizer directory of another name filled by the first summarizer step; the reranker wherever it is set; the
    question writer under its name."""
    plans = steps_for(settings.fast, settings.everything)
    by_name = {path.name: path for path in settings.summarizers}
    rewrite = [plan for plan in plans if plan.stage == "rewrite"]
    custom = settings.summarizers[0] if settings.summarizers and not set(by_name) & set(SUMMARIZERS) else None
    targets = []
    for plan in plans:
        if plan.stage == "rerank":
            targets.append((plan, settings.reranker))
        elif plan.stage == "retrieve":
            targets.append((plan, models_dir() / plan.model if settings.faq_index_dir else None))
        elif plan.stage == "adapt":  # the question writer of `medfaq index adapt` and the demo's Adapt page
            targets.append((plan, models_dir() / plan.model))
        elif plan.stage == "likelihood":  # ranks the fine-tuned index's bank: only where that index is set up
            targets.append((plan, models_dir() / plan.model if settings.faq_index_dir else None))
        else:
            targets.append(
                (plan, custom if custom and plan is rewrite[0] else None if custom else by_name.get(plan.model))
            )
    return targets


def default_steps(settings: DemoSettings, speed: MachineSpeed | None = None) -> list[SetupStep]:
    """The set-up steps of :mod:`app.setup_plan`: fetch MedQuAD and build the index when it is missing,
    then train the missing models (or skip them when training is off). Steps with nothing to do are marked done.
    Their minutes are those measured on the reference machine, or with `speed`, this machine's
    (:mod:`app.setup_speed`)."""

    def here(minutes: float, kind: str) -> float:
        return round(minutes * speed.factor(kind), 1) if speed else minutes

    source = ("--from", str(settings.shared_data)) if settings.shared_data else ()

    def fetch(*names: str) -> tuple[tuple[str, ...], ...]:
        return tuple(("data", "fetch", name, *source) for name in names)

    # the stock encoder the rule chooses for a first start, by name: `--encoder auto` would take the fine-tuned
    # bi-encoder once one is saved
    stock = ("index", "build", "medquad", "--synonyms", "none", "--out", str(settings.index_dirs[-1]))
    stock += ("--encoder", stock_encoder(first_run=True))
    index = SetupStep(
        "index",
        "Fetch MedQuAD and build the FAQ index",
        (*fetch("medquad"), stock),
        minutes=here(INDEX_MINUTES, "encode"),
    )
    index.status, index.detail = ("done", "ready") if settings.index_ready() else ("pending", "")
    steps = [index]
    targets = model_targets(settings)
    encoders = [plan for plan, _ in targets if plan.stage == "retrieve"]
    index_model, index_target = _index_encoder(settings, encoders)
    index_encoder = models_dir() / index_model
    for plan, target in targets:
        argv = plan.argv(target, index_encoder)
        step = SetupStep(plan.key, plan.title, (*fetch(*plan.data), *map(tuple, argv)), target)
        step.minutes = here(plan.pending_minutes(target), plan.kind)
        ready = target is not None and plan.ready(target)
        if plan is RERANKER and settings.faq_index_dir is not None:  # it corrects the MedQuAD index's encoder:
            ready = target is not None and reranker_corrects(target, index_encoder)
        steps.append(_with_status(step, target is None, ready, settings.train))
        if encoders and plan is encoders[-1]:  # after the encoders: the MedQuAD index
            steps.append(_faq_index_step(settings, index_model, index_target, here))
    return steps


def _index_encoder(settings: DemoSettings, planned: list[ModelStep]) -> tuple[str, Path | None]:
    """The encoder the MedQuAD index gets: the best fine-tuned one (`RETRIEVAL_ENCODERS`) already saved or trained by
    this set-up (so `--fast` after a full set-up keeps MPNet); None where the index is the user's own."""
    names = [plan.model for plan in planned]
    for name in RETRIEVAL_ENCODERS:
        if name in names or model_ready(models_dir() / name):
            return name, models_dir() / name if settings.faq_index_dir else None
    return names[-1], None


def _faq_index_step(
    settings: DemoSettings, model: str, encoder: Path | None, here: Callable[[float, str], float]
) -> SetupStep:
    """Encode the MedQuAD index with the fine-tuned `encoder` (`FAQ_INDEX_BUILDS`); done once it is encoded by it."""
    build = FAQ_INDEX_BUILDS[model]
    synonyms = " and MedQuAD's synonyms" if build.synonyms != "none" else ""
    title = f"Encode the MedQuAD index with the fine-tuned {model}{synonyms}"
    out = settings.faq_index_dir
    step = SetupStep("index-faq", title, (build.argv(encoder, out),) if encoder and out else ())
    step.minutes = here(build.minutes, build.kind)
    done = encoder is not None and out is not None and encoded_by(out, encoder)
    return _with_status(step, encoder is None or out is None, done, settings.train)


def _with_status(step: SetupStep, switched_off: bool, ready: bool, train: bool) -> SetupStep:
    """Mark a step done when it is switched off or what it makes is there, skipped when training is off."""
    if switched_off:
        step.status, step.detail = "done", "switched off"
    elif ready:
        step.status, step.detail = "done", "ready"
    elif not train:
        step.status, step.detail = "skipped", "not trained (training is switched off)"
    return step


class SetupRunner:
    """Runs the pending set-up steps one after another in a background thread; thread-safe snapshots for pages."""

    def __init__(self, settings: DemoSettings, steps: list[SetupStep] | None = None) -> None:
        """`steps`: what to run instead of :func:`default_steps`."""
        self.settings = settings
        self.log_dir = medfaq_home() / "demo" / "setup"
        self._lock = threading.Lock()
        self._steps = default_steps(settings, speed_here()) if steps is None else steps
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the set-up thread once; later calls do nothing."""
        with self._lock:
            if self._thread is not None or not any(step.status == "pending" for step in self._steps):
                return
            self._thread = threading.Thread(target=self._run, name="medfaq-demo-setup", daemon=True)
            self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def steps(self) -> list[SetupStep]:
        with self._lock:
            return [replace(step) for step in self._steps]

    def busy(self) -> bool:
        return any(step.status in {"pending", "running"} for step in self.steps())

    def log_path(self, step: SetupStep) -> Path:
        return self.log_dir / f"{step.key}.log"

    def _update(self, key: str, **changes) -> None:
        with self._lock:
            for position, step in enumerate(self._steps):
                if step.key == key:
                    self._steps[position] = replace(step, **changes)

    def _run(self) -> None:
        for step in self.steps():
            if step.status != "pending":
                continue
            self._update(step.key, status="running", started=time.time(), detail="starting")
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with self.log_path(step).open("w", encoding="utf-8") as log:
                ok, detail = True, "done"
                for command in step.commands:
                    ok, detail = self._run_command(step.key, command, log)
                    if not ok:  # a failed step is shown on the page; the next steps still run
                        break
            if ok and step.model is not None and not model_ready(step.model):
                ok, detail = False, f"finished, but no model was saved at {step.model}"
            self._update(step.key, status="done" if ok else "failed", finished=time.time(), detail=detail)

    def _run_command(self, key: str, command: tuple[str, ...], log: TextIO) -> tuple[bool, str]:
        """Run ``medfaq <command>``; its newest output line (tqdm bars included) becomes the step's detail."""
        log.write(f"$ medfaq {' '.join(command)}\n")
        last = f"medfaq {' '.join(command)}"
        self._update(key, detail=last)
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "medfaq.app", *command],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env=step_environment(),
            )
        except OSError as error:
            return False, f"cannot run medfaq: {error}"
        assert process.stdout is not None
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        buffer = ""
        while chunk := os.read(process.stdout.fileno(), 4096):
            text = decoder.decode(chunk)
            log.write(text)
            log.flush()
            *lines, buffer = re.split(r"[\r\n]", buffer + text)
            lines = [line.strip() for line in lines if line.strip()]
            if lines:
                last = lines[-1]
                self._update(key, detail=last)
        code = process.wait()
        return (True, "done") if code == 0 else (False, last)
