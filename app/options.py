"""Options and option callbacks the command modules share; each callback turns a bad number into a one-line usage
error."""

from __future__ import annotations

import math

import typer


def finite(value: float | None) -> float | None:
    """Option callback: reject nan and inf (a one-line usage error)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def positive(value: float | None) -> float | None:
    """Option callback: a finite number above 0 (e.g. a learning rate)."""
    if finite(value) is not None and value <= 0:
        raise typer.BadParameter(f"{value} is not above 0")
    return value


INDEX = typer.Option(
    None,
    "--index",
    help="Index directory (default: the one `medfaq setup` built, indexes/medquad-faq, else indexes/medquad-minilm).",
)
