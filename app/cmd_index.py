"""`medfaq index build|add|delete|info`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from index.collections import FORMATS, load_collection, parse_field_map
from index.encoder import Encoder
from index.faiss_store import KINDS
from index.faq_index import FIELDS, FaqIndex, check_index_target
from index.runtime import DEFAULT_ENCODER, MedfaqError

FORMAT_HELP = f"Collection format: {'|'.join(FORMATS)}."
FIELD_HELP = "Map a schema field to a source column of a generic JSONL/CSV file, e.g. --field question=title."


def check_choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise MedfaqError(f"unknown {option} {value!r}; choose one of {', '.join(choices)}")


def build(
    collection: str = typer.Argument(..., help="Collection file, or a fetched dataset name (medquad, quebec, jhu)."),
    out: Path = typer.Option(..., "--out", help="Index directory to write (replaced atomically if it exists)."),
    format: str = typer.Option("auto", "--format", help=FORMAT_HELP),
    encoder: str = typer.Option(DEFAULT_ENCODER, "--encoder", help="minilm, a model directory or a hub id."),
    fields: str = typer.Option("question", "--fields", help=f"Text to index: {'|'.join(FIELDS)}."),
    kind: str = typer.Option("flat", "--kind", help=f"FAISS index kind: {'|'.join(KINDS)}."),
    field: list[str] = typer.Option([], "--field", help=FIELD_HELP),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip malformed lines (counted) instead of failing."),
    device: str | None = typer.Option(None, "--device", help="cpu or cuda (default: cuda when available)."),
    gpu: bool = typer.Option(False, "--gpu", help="Search FAISS on the GPU when one is present."),
    batch_size: int = typer.Option(64, "--batch-size", help="Encoding batch size."),
) -> None:
    """Build a dense (FAISS) + BM25 index over an FAQ collection."""
    check_choice("--kind", kind, KINDS)
    check_choice("--fields", fields, FIELDS)
    check_index_target(out)
    sentence_encoder = Encoder(encoder, device=device, batch_size=batch_size)
    records, report = load_collection(collection, format, parse_field_map(field), skip_bad)
    typer.echo(report.summary(), err=True)
    index = FaqIndex.build(
        records,
        sentence_encoder,
        fields=fields,
        kind=kind,
        backend_options={"use_gpu": gpu},
    )
    target = index.save(out)
    typer.echo(f"indexed {len(index)} FAQs into {target}")


def add(
    directory: Path = typer.Argument(..., help="Index directory."),
    collection: str = typer.Argument(..., help="Collection file with the new FAQs."),
    format: str = typer.Option("auto", "--format", help=FORMAT_HELP),
    field: list[str] = typer.Option([], "--field", help=FIELD_HELP),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip malformed lines (counted) instead of failing."),
) -> None:
    """Add FAQs to an index (only the new ones are encoded); ids already in the index are an error."""
    index = FaqIndex.load(directory)
    records, report = load_collection(collection, format, parse_field_map(field), skip_bad)
    typer.echo(report.summary(), err=True)
    added = index.add(records)
    index.save(directory)
    typer.echo(f"added {added} FAQs; the index now holds {len(index)}")


def delete(
    directory: Path = typer.Argument(..., help="Index directory."),
    ids: list[str] = typer.Argument(..., help="FAQ ids to remove."),
) -> None:
    """Remove FAQs by id (no re-encoding, no rebuild)."""
    index = FaqIndex.load(directory)
    removed = index.delete(ids)
    index.save(directory)
    typer.echo(f"deleted {removed} FAQs; the index now holds {len(index)}")


def info(
    directory: Path = typer.Argument(..., help="Index directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the information as JSON."),
) -> None:
    """Show an index's manifest: encoder, dimension, fields, kind, counts, sources."""
    details = FaqIndex.load(directory).info()
    if as_json:
        typer.echo(json.dumps(details, indent=2))
        return
    for key, value in details.items():
        typer.echo(f"{key:<15} {json.dumps(value) if isinstance(value, (dict, list)) else value}")
