"""`medfaq queue ...`: the experts' queue of an index: list the groups of questions it abstained on, then link a
group to an FAQ, answer it with a new FAQ, split, merge or undo."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from medfaq.app.cmd_index import check_choice
from medfaq.app.options import INDEX
from medfaq.common.runtime import plural
from medfaq.retriever.trained_models import set_up_index

GROUP = typer.Argument(..., min=1, help="The group's id (see `medfaq queue list`).")
BY = typer.Option("", "--by", help="Who answers (recorded with the change).")


def _queue(index: Path | None):
    """The queue of `index` (the set-up index when None) with the questions logged since it was last read, and the
    index directory; the queue's groups are that index's only."""
    from medfaq.index.faq_index import FaqIndex
    from medfaq.retriever.pipeline_file import read_config
    from medfaq.retriever.queue.question_queue import open_queue

    directory = index or set_up_index()
    config = read_config(directory)
    queue = open_queue(FaqIndex.load(directory), config)
    queue.sync()
    return queue, directory


def list_groups(
    index: Path | None = INDEX,
    status: str = typer.Option("waiting", "--status", help="waiting | linked | answered | all"),
    as_json: bool = typer.Option(False, "--json", help='{"groups": [...]}, as GET /queue answers.'),
) -> None:
    """The index's groups of questions waiting for an expert, most asked first."""
    from medfaq.retriever.queue.question_queue import STATUSES

    check_choice("--status", status, (*STATUSES, "all"))
    queue, _ = _queue(index)
    groups = queue.groups(None if status == "all" else status)
    if as_json:
        typer.echo(json.dumps({"groups": [group.to_dict() for group in groups]}, ensure_ascii=False))
        return
    for group in groups:
        answered = f" -> {group.faq_id} ({group.status})" if group.status != "waiting" else ""
        typer.echo(f"group {group.id}: {group.title}  [asked {group.count}x]{answered}")
        for question in group.questions:
            typer.echo(f"    {question.id:>6}  {question.text}")
    if not groups:
        typer.echo(f"no {status} groups" if status != "all" else "the queue is empty", err=True)


def link(
    group: int = GROUP,
    faq_id: str = typer.Argument(..., help="The FAQ that answers the group's questions."),
    index: Path | None = INDEX,
    by: str = BY,
) -> None:
    """Answer a group with an existing FAQ: its questions become that FAQ's phrasings in the index."""
    queue, directory = _queue(index)
    done = queue.link(group, faq_id, by)
    typer.echo(f"group {group}: {plural(done.count, 'question')} linked to FAQ {faq_id} (index {directory})")


def answer(
    group: int = GROUP,
    question: str = typer.Option(..., "--question", help="The new FAQ's question (start from the group's title)."),
    answer_text: str = typer.Option(..., "--answer", help="The new FAQ's answer."),
    index: Path | None = INDEX,
    by: str = BY,
) -> None:
    """Answer a group with a new FAQ, added to the index with the group's questions as its phrasings."""
    queue, directory = _queue(index)
    done = queue.answer(group, question, answer_text, by)
    typer.echo(f"group {group}: new FAQ {done.faq_id} added to {directory}, answering {plural(done.count, 'question')}")


def split(
    group: int = GROUP,
    question_ids: list[int] = typer.Argument(..., help="The ids of the questions that move to a new group."),
    index: Path | None = INDEX,
) -> None:
    """Move some questions of one of the index's groups into a new group."""
    queue, _ = _queue(index)
    new = queue.split(group, question_ids)
    typer.echo(f"group {new.id}: {plural(new.count, 'question')} split from group {group}")


def merge(
    groups: list[int] = typer.Argument(..., help="Two or more group ids; the first keeps every question."),
    index: Path | None = INDEX,
) -> None:
    """Merge groups of the index that ask the same question."""
    queue, _ = _queue(index)
    merged = queue.merge(groups)
    typer.echo(f"group {merged.id}: {plural(merged.count, 'question')}")


def undo(group: int = GROUP, index: Path | None = INDEX) -> None:
    """Take back a link or an answer: the index forgets it and the group waits again."""
    queue, directory = _queue(index)
    queue.undo(group)
    typer.echo(f"group {group} waits again; {directory} no longer holds its answer")
