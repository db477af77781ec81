"""The command-line reference in docs/cli.md, written from the command tree itself so that it cannot drift.

``python -m medfaq.app.cli_reference > docs/cli.md``
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import typer.main
from typer.core import TyperGroup

from medfaq.app.cli import app

if TYPE_CHECKING:
    from click import Command, Context

REGENERATE = "python -m medfaq.app.cli_reference > docs/cli.md"
# Help records are laid out for this width whatever the terminal, so the page reads the same on every machine.
WIDTH = 120


def _paragraphs(text: str) -> str:
    """A help text's paragraphs, each on one line (click's `\\b` no-rewrap markers dropped)."""
    blocks = re.split(r"\n\s*\n", text.strip())
    return "\n\n".join(
        " ".join(line.strip() for line in block.splitlines() if line.strip() != "\b") for block in blocks
    )


def _subcommands(command: Command, ctx: Context) -> Iterator[tuple[str, Command]]:
    """A group's visible commands in the order `--help` lists them; none for a plain command."""
    if isinstance(command, TyperGroup):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield name, sub


def _commands(command: Command, ctx: Context) -> Iterator[tuple[Command, Context]]:
    """The command and every command below it, depth first."""
    yield command, ctx
    for name, sub in _subcommands(command, ctx):
        yield from _commands(sub, sub.context_class(sub, info_name=name, parent=ctx))


def _section(command: Command, ctx: Context) -> list[str]:
    """One command's markdown: heading, usage, help, then its arguments and options one per line."""
    level = "#" * min(ctx.command_path.count(" ") + 2, 4)
    lines = [
        f"{level} `{ctx.command_path}`",
        "",
        "```",
        f"{ctx.command_path} {' '.join(command.collect_usage_pieces(ctx))}",
        "```",
        "",
    ]
    if command.help:
        lines += [_paragraphs(command.help), ""]
    subcommands = [
        f"- `{ctx.command_path} {name}`: {sub.get_short_help_str(limit=10_000)}"
        for name, sub in _subcommands(command, ctx)
    ]
    if subcommands:
        lines += [*subcommands, ""]
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None or param.name == "help":
            continue
        names, help_text = record
        lines.append(f"- `{names}`" + (f": {_paragraphs(help_text)}" if help_text else ""))
    if lines[-1] != "":
        lines.append("")
    return lines


def cli_reference() -> str:
    """The whole reference page as markdown."""
    root = typer.main.get_command(app)
    root_ctx = root.context_class(root, info_name="medfaq", terminal_width=WIDTH, max_content_width=WIDTH)
    lines = [
        "# medfaq command-line reference",
        "",
        f"Generated from the commands themselves; regenerate with `{REGENERATE}`",
        "(`tests/test_cli_reference.py` fails while this page differs). Every command also takes `--help`.",
        "The conventions every command keeps (exit codes, one-line errors, ids) are in",
        "[command-line.md](command-line.md).",
        "",
    ]
    for command, ctx in _commands(root, root_ctx):
        lines += _section(command, ctx)
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> None:
    print(cli_reference(), end="")


if __name__ == "__main__":
    main()
