"""`medfaq setup`: fetch the data and train the models the default pipeline uses, skipping those present.

The steps come from :mod:`app.setup_plan` (through :func:`app.setup_state.default_steps`, which the demo's
first-run set-up runs too); each command runs as ``medfaq ...`` with its own progress bars.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import typer

from medfaq.app.setup_plan import MODEL_STEPS, left_out, step_environment, step_of
from medfaq.app.setup_speed import MachineSpeed, speed_here
from medfaq.app.setup_state import REPO_ROOT, DemoSettings, SetupStep, default_steps
from medfaq.common.runtime import MedfaqError
from medfaq.retriever.trained_models import SET_UP_MODELS, ModelNotTrained


def plan_lines(steps: list[SetupStep], speed: MachineSpeed, fast: bool = False, everything: bool = False) -> list[str]:
    """One line per step: its state, time here (`speed`: this machine's) and commands; then the total time of what
    will run, and the models this set-up leaves to the commands that need them."""
    lines = []
    for number, step in enumerate(steps, 1):
        if step.status == "pending":
            lines.append(f"[{number}/{len(steps)}] {step.title}: about {step.minutes:g} min\n    {step.shown_command}")
        else:
            lines.append(f"[{number}/{len(steps)}] {step.title}: {step.detail}")
    pending = [step for step in steps if step.status == "pending"]
    total = sum(step.minutes for step in pending)
    lines.append(
        f"{len(pending)} step(s) to run, about {total:g} min here (the times measured on the reference machine, "
        f"training x{speed.factor('train'):.2f} and encoding x{speed.factor('encode'):.2f} as this machine timed "
        "them)"
        if pending
        else "everything is ready"
    )
    later = left_out(fast, everything)
    if later:
        names = ", ".join(step.model for step in later)
        lines.append(f"left to the commands that need them (or `medfaq setup --all`): {names}")
    return lines


def setup(
    fast: bool = typer.Option(
        False,
        "--fast",
        help="Fine-tune MiniLM instead of MPNet as the retrieval encoder (8.0 R@1 lower on COVID-Q, 2.4 on Quebec); "
        "with --all, also leave out MPNet, the Gemma summarizers, the rank models and the question writer.",
    ),
    everything: bool = typer.Option(
        False,
        "--all",
        help="Also train every model the default pipeline leaves off (the fine-tuned MiniLM, summarizers, reranker, "
        "question writer, rank models) up front, instead of on first need.",
    ),
    models: list[str] | None = typer.Option(
        None,
        "--model",
        help="Train only this set-up model (and the models it starts from), e.g. reranker-correction-quick; "
        "repeatable. The names: " + ", ".join(SET_UP_MODELS) + ".",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the steps and their times; run nothing."),
    source: Path | None = typer.Option(
        None,
        "--from",
        help="Install the models a `medfaq models export` file holds instead of training them (`medfaq models import "
        "FILE`; with --dry-run: verify it and say what would change).",
    ),
) -> None:
    """Prepare the models the default pipeline uses: the MedQuAD index and the fine-tuned retrieval encoder that
    encodes it, trained with its quick preset into $MEDFAQ_HOME/models (present ones are skipped). Every other model
    is trained by the command that needs it, which says so first."""
    if source is not None:
        from medfaq.app.cmd_models import import_file

        import_file(source, force=False, dry_run=dry_run)
        return
    speed = speed_here()
    if models:
        steps = steps_training(models, speed)
        for line in plan_lines(steps, speed, fast, everything=True):
            typer.echo(line)
        if not dry_run:
            run_steps(steps)
        return
    steps = default_steps(DemoSettings.from_env(fast=fast, everything=everything), speed)
    # the plan is the command's output (`medfaq setup --dry-run > plan.txt`)
    for line in plan_lines(steps, speed, fast, everything):
        typer.echo(line)
    if dry_run:
        return
    run_steps([step for step in steps if step.status == "pending"])


def run_steps(pending: list[SetupStep]) -> None:
    """Run each step's ``medfaq`` commands in turn, with their own progress bars; a failed command ends the run."""
    for number, step in enumerate(pending, 1):
        left = sum(later.minutes for later in pending[number - 1 :])
        typer.echo(
            f"==> ({number}/{len(pending)}) {step.title} (about {step.minutes:g} min; {left:g} min left in all)",
            err=True,
        )
        start = time.monotonic()
        for command in step.commands:
            typer.echo(f"$ medfaq {' '.join(command)}", err=True)
            code = subprocess.run(
                [sys.executable, "-m", "medfaq.app", *command], cwd=REPO_ROOT, env=step_environment()
            ).returncode
            if code != 0:
                typer.echo(
                    f"error: set-up step {step.key!r} failed (exit {code}): medfaq {' '.join(command)}", err=True
                )
                raise typer.Exit(code)
        typer.echo(f"    done in {(time.monotonic() - start) / 60:.1f} min", err=True)
    if pending:
        typer.echo("set-up complete", err=True)


def steps_training(models: list[str], speed: MachineSpeed) -> list[SetupStep]:
    """The pending set-up steps that train the set-up `models` (by name) and the models they start from, in the
    order the set-up runs them, timed for this machine (`speed`); a name that is no set-up model is a one-line
    error."""
    unknown = [name for name in models if step_of(name) is None]
    if unknown:
        raise MedfaqError(f"no set-up model {unknown[0]!r}; choose among {', '.join(SET_UP_MODELS)}")
    steps = {step.key: step for step in default_steps(DemoSettings.from_env(everything=True), speed)}
    wanted: list[SetupStep] = []

    def add(key: str) -> None:
        plan = next(plan for plan in MODEL_STEPS if plan.key == key)
        for need in plan.needs:
            add(need)
        if steps[key].status == "pending" and steps[key] not in wanted:
            wanted.append(steps[key])

    for name in models:
        add(step_of(name).key)
    return wanted


def train_on_first_need(missing: ModelNotTrained, yes: bool) -> None:
    """Train the set-up model a command found missing (and the models it starts from), after saying what that
    trains and how long it takes: at once with `yes`, else after a yes at a terminal; elsewhere it is the one-line
    error, naming ``--yes`` and the time."""
    wanted = steps_training([missing.model], speed_here())
    if not wanted:
        raise missing
    minutes = sum(step.minutes for step in wanted)
    if not yes and not sys.stdin.isatty():
        raise MedfaqError(f"{missing}; training it takes about {minutes:g} min") from missing
    titles = "; ".join(step.title for step in wanted)
    typer.echo(f"{missing.model} is not trained yet: {titles} (about {minutes:g} min)", err=True)
    if not yes and not typer.confirm("Train it now?", err=True):
        raise missing
    run_steps(wanted)
