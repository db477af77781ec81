"""`medfaq data fetch|list`."""

from __future__ import annotations

from pathlib import Path

import typer


def fetch(
    name: str = typer.Argument(..., help="Dataset name (see `medfaq data list`)."),
    from_dir: Path | None = typer.Option(
        None, "--from", help="Copy from a local folder with the shared/data layout instead of downloading."
    ),
    force: bool = typer.Option(False, "--force", help="Fetch again even when the files are present."),
) -> None:
    """Download a public dataset from its original source (or copy it with --from) into the data directory."""
    from medfaq.index.datasets import DATASETS, fetch_dataset

    target = fetch_dataset(name, from_dir, force=force)
    typer.echo(f"{name}: {', '.join(DATASETS[name].files)} in {target}")


def list_datasets() -> None:
    """List the datasets `medfaq data fetch` knows, with their licenses and whether they are fetched."""
    from medfaq.index.datasets import DATASETS, dataset_dir, is_fetched

    for spec in DATASETS.values():
        state = f"fetched in {dataset_dir(spec.name)}" if is_fetched(spec.name) else "not fetched"
        typer.echo(f"{spec.name:<10} {spec.description}\n{'':<10} license: {spec.license}\n{'':<10} {state}")
