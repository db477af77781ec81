"""Argument types and report printing shared by the `python -m medfaq.eval.*` scripts."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def int_at_least(minimum: int) -> Callable[[str], int]:
    """argparse type of the `python -m medfaq.eval.*` scripts: an integer of at least `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is not at least {minimum}")
        return value

    return parse


positive_int = int_at_least(1)


def existing_file(text: str) -> Path:
    """argparse type of the `python -m medfaq.eval.*` scripts: the path of a file that exists."""
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text!r}: no such file")
    return Path(text)


def print_report(report: dict[str, Any], out: Path | None = None) -> None:
    """Print a `python -m medfaq.eval.*` script's report as indented JSON, and write it to `out` when given."""
    text = json.dumps(report, indent=2)
    print(text)
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")


def report_or_error(make: Callable[[], dict[str, Any]], out: Path | None = None) -> int:
    """Exit status of a `python -m medfaq.eval.*` script: 0 after printing the report `make` returns
    (:func:`print_report`), 2 after one ``error:`` line on stderr where it raised a `MedfaqError`."""
    import sys

    from medfaq.common.runtime import MedfaqError

    try:
        report = make()
    except MedfaqError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print_report(report, out)
    return 0
