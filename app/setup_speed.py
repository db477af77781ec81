"""The set-up's times on this machine. Each set-up step was timed on one machine (`REFERENCE`); a step's minutes
here are those minutes times how much slower this machine runs the step's kind of work, timed here with the same
probes: ``train`` (training steps of stock MPNet, the default encoder's start, in the precision `auto` trains in: a
smaller model's steps measured a CPU without AMX 1.5 times slower where MPNet's were 3.2 times) and ``encode`` (texts
encoded by the stock MiniLM on the runtime `auto` picks for an index build). The probes run as the steps do,
in a process on every core (`app.setup_plan.step_environment`), take about ten seconds, and are kept per machine in
``$MEDFAQ_HOME/setup-speed.json``.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from medfaq.app.setup_plan import step_environment
from medfaq.common.runtime import MedfaqError, fastest_seconds, logger, medfaq_home

KINDS = ("train", "encode")
SPEED_FILE = "setup-speed.json"
PROBE_TEXT = (
    "my mother was told she has high blood pressure and her doctor gave her lisinopril, she now has a dry cough at "
    "night and some swelling in her ankles, is that from the medicine and should she stop it?"
)
PROBE_BATCH = 16  # texts per probe training step and per encoded batch
PROBES = 2  # the probes' version: a file timed by other probes is timed again (1: a MiniLM training step)


@dataclass(frozen=True)
class MachineSpeed:
    """Seconds this machine takes for one probe of each kind: a training step (`train`) and encoding a batch of
    texts (`encode`); `machine` says which machine it is (`machine_name`), `probes` which probes timed it."""

    train: float
    encode: float
    machine: str
    probes: int = PROBES

    def factor(self, kind: str) -> float:
        """How many times longer work of `kind` takes here than on the `REFERENCE` machine."""
        return getattr(self, kind) / getattr(REFERENCE, kind)


REFERENCE = MachineSpeed(
    train=1.0, encode=0.030, machine="Intel(R) Xeon(R) Processor (AMX: bf16 training and encoding), 2 cores"
)
"""The probes on the machine the default set-up's minutes were measured on (app.setup_plan), alone, on both cores
(two timings agreeing within 3 %)."""


def machine_name() -> str:
    """The CPU model and the cores this process may use: what the probes' times depend on."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if "model name" in line]
        model = names[0] if names else model
    return f"{model}, {step_environment()['OMP_NUM_THREADS']} cores"


def probe_training(steps: int = 2) -> float:
    """Seconds of the fastest of `steps` training steps (forward, in-batch contrastive loss, backward, AdamW) of
    stock MPNet on `PROBE_BATCH` long questions, after one warm-up step."""
    import torch
    from sentence_transformers import SentenceTransformer

    from medfaq.common.runtime import autocast, resolve_model

    model = SentenceTransformer(resolve_model("mpnet"), device="cpu")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    features = model.preprocess([PROBE_TEXT] * PROBE_BATCH)

    def step() -> None:
        with autocast("auto"):
            vectors = model(features)["sentence_embedding"].float()
            loss = torch.nn.functional.cross_entropy(vectors @ vectors.T, torch.arange(PROBE_BATCH))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return fastest_seconds(step, steps)


def probe_encoding(repeats: int = 3) -> float:
    """Seconds of the fastest of `repeats` encodings of `PROBE_BATCH` texts by the stock MiniLM on the runtime an
    index build takes here (``auto``), after one warm-up."""
    from medfaq.index.encoder import load_encoder

    encoder = load_encoder("minilm", backend="auto")
    texts = [f"{PROBE_TEXT} ({number})" for number in range(PROBE_BATCH)]
    return fastest_seconds(lambda: encoder.encode(texts), repeats)


def measure_speed() -> tuple[float, float]:
    """The training and encoding probes, timed in a process of their own on every core, as the steps run."""
    code = (
        "from medfaq.app.setup_speed import probe_encoding, probe_training\nprint(probe_training(), probe_encoding())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=step_environment(), check=False
    )
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise MedfaqError(f"timing this machine's speed failed: {last[0]}")
    train, encode = map(float, done.stdout.split()[-2:])
    return train, encode


def speed_here(path: Path | None = None) -> MachineSpeed:
    """This machine's probes: read from `path` (default ``$MEDFAQ_HOME/setup-speed.json``) when they were timed on
    this machine by these probes, else timed now and saved there."""
    path = path or medfaq_home() / SPEED_FILE
    name = machine_name()
    if path.is_file():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            if saved.get("machine") == name and saved.get("probes") == PROBES:
                return MachineSpeed(**saved)
        except (AttributeError, TypeError, ValueError):  # damaged: time again
            pass
    logger.info("timing this machine's training and encoding speed for the set-up's estimates (once)")
    train, encode = measure_speed()
    speed = MachineSpeed(train=train, encode=encode, machine=name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(speed), indent=1) + "\n", encoding="utf-8")
    return speed
