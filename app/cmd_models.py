"""`medfaq models export|import|list`: the trained models in one file, to train on one machine and serve on another."""

from __future__ import annotations

from pathlib import Path

import typer


def export(
    file: Path = typer.Argument(..., help="The file to write: .tar, or compressed: .tar.gz, .tar.bz2, .tar.xz."),
    everything: bool = typer.Option(
        False, "--all", help="Every model `medfaq train` saved under $MEDFAQ_HOME/models, not only the set-up's."
    ),
) -> None:
    """Write the set-up's models saved under $MEDFAQ_HOME/models (by `medfaq setup`, or by a command on first need)
    and the MedQuAD index with its decisions into one file, whose manifest lists each one's checksums, training
    config and threshold."""
    from medfaq.app.model_bundle import describe, export_models

    manifest = export_models(file, everything)
    for entry in manifest["items"]:
        typer.echo(describe(entry))
    typer.echo(f"wrote {len(manifest['items'])} item(s) to {file}")


def import_file(
    file: Path = typer.Argument(..., help="A file `medfaq models export` wrote."),
    force: bool = typer.Option(False, "--force", help="Replace installed models and indexes that differ."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Verify the file, say what would change; install nothing."),
) -> None:
    """Install the models (and the MedQuAD index) of a model file into $MEDFAQ_HOME, after verifying every checksum;
    each one is renamed into place whole, and a damaged, truncated, foreign or newer file installs nothing."""
    from medfaq.app.model_bundle import describe, import_models

    for entry, outcome in import_models(file, force=force, dry_run=dry_run):
        typer.echo(f"{outcome}: {describe(entry)}")


def list_models(
    file: Path | None = typer.Argument(None, help="A model file: list what it holds (its manifest) instead."),
) -> None:
    """List the trained models and the MedQuAD index this home holds (`setup`: what `models export` ships without
    --all), or what a model file holds."""
    from medfaq.app.model_bundle import describe, installed_items, read_manifest_of

    if file is not None:
        manifest = read_manifest_of(file)
        typer.echo(
            f"{file}: model file format {manifest['format_version']}, written by medfaq "
            f"{manifest.get('medfaq_version', '?')} on {manifest.get('created', '?')}"
        )
        for entry in manifest["items"]:
            typer.echo(describe(entry))
        return
    items = installed_items()
    if not items:
        typer.echo("no trained model here: run `medfaq setup`, or `medfaq models import FILE`")
    for entry in items:
        typer.echo(f"{describe(entry)}{', setup' if entry['setup'] else ''}")
