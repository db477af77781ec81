"""`medfaq summarize`: question summaries (and the question files other commands read)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from medfaq.app.options import DEVICE, GUIDANCE, LENGTH_PENALTY, MBR
from medfaq.common.runtime import MedfaqError, local_model_dir

TEXT_FIELDS = ("chq", "question", "text")


def read_texts(path: Path) -> tuple[list[dict], list[str]]:
    """The rows of a JSONL file of questions and each row's text; a row without text, or with empty or invalid
    text, is a one-line error naming its line."""
    from medfaq.retriever.search import check_query

    if not path.is_file():
        raise MedfaqError(f"input file {path} does not exist")
    rows, texts = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise MedfaqError(f"{path}:{number}: not valid JSON") from None
        text = next((row[k] for k in TEXT_FIELDS if isinstance(row, dict) and isinstance(row.get(k), str)), None)
        if text is None:
            raise MedfaqError(f"{path}:{number}: needs a text field ({' or '.join(TEXT_FIELDS)})")
        rows.append(row)
        texts.append(check_query(text, f"{path}:{number}: the question"))
    return rows, texts


def summarize(
    text: str | None = typer.Argument(None, help="A consumer health question (omit with --input)."),
    model: str | None = typer.Option(
        None, "--model", help="Trained summarizer directory or name (default: the best one `medfaq setup` trained)."
    ),
    input: Path | None = typer.Option(None, "--input", help='JSONL file of {"chq"|"question"|"text": ...} lines.'),
    output: Path | None = typer.Option(None, "--output", help='JSONL to write (input rows plus "summary").'),
    num_beams: int = typer.Option(1, "--num-beams", min=1, help="Beam size (1: greedy)."),
    max_length: int = typer.Option(64, "--max-length", min=1, help="Maximum new tokens per summary."),
    batch_size: int = typer.Option(16, "--batch-size", min=1, help="Questions per batch."),
    mbr: int = MBR,
    guidance: float = GUIDANCE,
    length_penalty: float = LENGTH_PENALTY,
    device: str | None = DEVICE,
) -> None:
    """Summarize consumer health questions into short FAQ-style questions."""
    from medfaq.retriever.runs import check_not_an_input
    from medfaq.retriever.search import check_query
    from medfaq.retriever.stages.base import set_up_model
    from medfaq.retriever.trained_models import best_summarizer
    from medfaq.summarizer.decoding import Decoding
    from medfaq.summarizer.generation import Summarizer

    if (text is None) == (input is None):
        raise MedfaqError("give either a question or --input FILE.jsonl (with --output OUT.jsonl)")
    if input is not None and output is None:
        raise MedfaqError("--input needs --output OUT.jsonl")
    default = best_summarizer()
    if output is not None:
        check_not_an_input(output, input, local_model_dir(model or default))
    rows, texts = read_texts(input) if input is not None else ([], [check_query(text, "the question")])
    chosen = set_up_model(model, "summarizer", default)
    decoding = Decoding(num_beams, max_length, length_penalty, guidance, mbr)
    summaries = Summarizer.load(chosen, device=device).summarize(texts, decoding, batch_size)
    if input is None:
        typer.echo(summaries[0])
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w", encoding="utf-8") as handle:
        for row, summary in zip(rows, summaries, strict=True):
            handle.write(json.dumps({**row, "summary": summary}, ensure_ascii=False) + "\n")
    typer.echo(f"wrote {len(summaries)} summaries to {output}")
