"""`medfaq setup`: fetch the data and train every model the default pipeline and the demo use, skipping those present.

The steps come from :mod:`retriever.setup_plan` (through :func:`app.setup_state.default_steps`, which the demo's
first-run set-up runs too); each command runs as ``medfaq ...`` with its own progress bars.
"""

from __future__ import annotations

import subprocess
import sys
import time

import typer

from medfaq.app.setup_state import REPO_ROOT, DemoSettings, SetupStep, default_steps


def plan_lines(steps: list[SetupStep]) -> list[str]:
    """One line per step: its state, measured time and commands; then the total time of what will run."""
    lines = []
    for number, step in enumerate(steps, 1):
        if step.status == "pending":
            lines.append(f"[{number}/{len(steps)}] {step.title}: about {step.minutes:g} min\n    {step.shown_command}")
        else:
            lines.append(f"[{number}/{len(steps)}] {step.title}: {step.detail}")
    pending = [step for step in steps if step.status == "pending"]
    total = sum(step.minutes for step in pending)
    lines.append(
        f"{len(pending)} step(s) to run, about {total:g} min on 2 CPU cores (measured beside other jobs)"
        if pending
        else "everything is ready"
    )
    return lines


def setup(
    fast: bool = typer.Option(False, "--fast", help="Leave out the slow Gemma summarizer (MiniLM ECL only)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the steps and their times; run nothing."),
) -> None:
    """Prepare every model the default pipeline and the demo use: the MedQuAD index, the question summarizer(s)
    and the FAQ reranker, trained with their quick presets into $MEDFAQ_HOME/models (present ones are skipped)."""
    steps = default_steps(DemoSettings.from_env(fast=fast))
    for line in plan_lines(steps):  # the plan is the command's output (`medfaq setup --dry-run > plan.txt`)
        typer.echo(line)
    if dry_run:
        return
    pending = [step for step in steps if step.status == "pending"]
    for number, step in enumerate(pending, 1):
        typer.echo(f"==> ({number}/{len(pending)}) {step.title} (about {step.minutes:g} min)", err=True)
        start = time.monotonic()
        for command in step.commands:
            typer.echo(f"$ medfaq {' '.join(command)}", err=True)
            code = subprocess.run([sys.executable, "-m", "medfaq.app", *command], cwd=REPO_ROOT).returncode
            if code != 0:
                typer.echo(
                    f"error: set-up step {step.key!r} failed (exit {code}): medfaq {' '.join(command)}", err=True
                )
                raise typer.Exit(code)
        typer.echo(f"    done in {(time.monotonic() - start) / 60:.1f} min", err=True)
    if pending:
        typer.echo("set-up complete", err=True)
