"""``pipeline.json``, the :class:`~retriever.pipeline.PipelineConfig` saved beside an index: the one module that reads
and writes it. Everything else asks here: :func:`read_config` for the settings (with a call's overrides),
:func:`config_bytes` and :func:`parse_config` to compare what is on disk with what was loaded, :func:`write_config`,
and :func:`update_config` (:func:`store_threshold`) to change it under the index's write lock.

The file is written in format 2 (``"format": 2``): the first stage's settings at the top, each stage's under
``"stages"`` by its name, named as its settings' fields (``{"stages": {"rerank": {"on": true, "depth": 20, ...}}}``).
A file without ``format`` is of the first format, every setting at the top by its flat name (``"rerank_depth"``);
it is still read, and written again in format 2 by the next change."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from medfaq.common.runtime import MedfaqError
from medfaq.common.settings import declared_settings
from medfaq.retriever.pipeline import PipelineConfig, flag_changes, upgraded
from medfaq.retriever.stages import stage_named
from medfaq.retriever.threshold_files import with_model_thresholds

PIPELINE_FILE = "pipeline.json"
FORMAT = 2  # settings nested by stage; files without a format are of the first one, every setting flat


def config_path(directory: str | Path) -> Path:
    """Where the pipeline file of the index at `directory` is."""
    return Path(directory) / PIPELINE_FILE


def config_bytes(directory: str | Path) -> bytes | None:
    """The bytes of `directory`'s ``pipeline.json`` (None when it has none): cheap to compare with what was loaded."""
    path = config_path(directory)
    if not path.is_file():
        return None
    try:
        return path.read_bytes()
    except FileNotFoundError:  # removed since
        return None


def parse_config(
    saved: bytes | None, directory: str | Path, overrides: Mapping[str, Any] | None = None
) -> PipelineConfig:
    """The settings of `directory`'s ``pipeline.json`` read as `saved` (None: there is none, the defaults), with
    `overrides` (by flat name, None = not given) applied as the command line's flags are
    (:func:`~retriever.pipeline.flag_changes`), built into one config, and the abstention thresholds the index's
    models carry for every configuration the file has none for
    (:func:`~retriever.threshold_files.with_model_thresholds`): a missing or partial file still abstains. An invalid
    file is a one-line error naming it; an invalid override, its setting's."""
    data = {} if saved is None else upgraded(_settings(saved, directory))
    changes = flag_changes(data.get("query_source", "raw"), **(overrides or {}))
    try:
        config = PipelineConfig(**{**data, **changes})
    except MedfaqError:
        if saved is not None:
            _check_saved(data, directory)
        raise
    return with_model_thresholds(config, directory)


def _check_saved(data: dict[str, Any], directory: str | Path) -> None:
    """A one-line error naming the file where its own settings `data` are invalid."""
    try:
        PipelineConfig(**data)
    except MedfaqError as error:
        raise MedfaqError(f"{config_path(directory)} is not a valid pipeline config: {error}") from None


def _settings(saved: bytes, directory: str | Path) -> dict[str, Any]:
    """The flat settings of a ``pipeline.json`` of either format."""
    try:
        data = json.loads(saved.decode("utf-8"))
        if not isinstance(data, dict):
            raise MedfaqError(f"expected a JSON object of settings, got {type(data).__name__}")
        return flat_settings(data)
    except (UnicodeDecodeError, json.JSONDecodeError, MedfaqError) as error:
        raise MedfaqError(f"{config_path(directory)} is not a valid pipeline config: {error}") from None


def flat_settings(data: dict[str, Any]) -> dict[str, Any]:
    """The settings of a ``pipeline.json`` object by their flat names: a file of the first format as it is, one of
    format 2 with each stage's settings named as the doors name them."""
    if "format" not in data:
        return data
    if data["format"] != FORMAT:
        raise MedfaqError(f"format {data['format']!r} is not one this medfaq reads (it reads 1 and {FORMAT})")
    settings = {name: value for name, value in data.items() if name not in ("format", "stages")}
    stages = data.get("stages", {})
    if not isinstance(stages, dict):
        raise MedfaqError(f"stages must be an object, got {stages!r}")
    for name, fields in stages.items():
        stage = stage_named(name)
        if stage is None:
            raise MedfaqError(f"unknown pipeline stage {name!r}")
        if not isinstance(fields, dict):
            raise MedfaqError(f"the {name} stage's settings must be an object, got {fields!r}")
        unknown = sorted(set(fields) - set(declared_settings(stage.settings)))
        if unknown:
            raise MedfaqError(f"unknown setting(s) of the {name} stage: {', '.join(unknown)}")
        settings |= {stage.flat_name(field): value for field, value in fields.items()}
    return settings


def file_data(config: PipelineConfig) -> dict[str, Any]:
    """`config` as ``pipeline.json`` holds it (format 2)."""
    stages = {name: asdict(settings) for name, settings in config.stages.items()}
    nested = {stage.flat_name(field) for stage in map(stage_named, stages) for field in stages[stage.name]}
    top = {name: value for name, value in config.to_dict().items() if name not in nested}
    return {"format": FORMAT, **top, "stages": stages}


def read_config(directory: str | Path, overrides: Mapping[str, Any] | None = None) -> PipelineConfig:
    """``pipeline.json`` of `directory` (an index directory), or the defaults when there is none, with `overrides`,
    as :func:`parse_config` reads it."""
    return parse_config(config_bytes(directory), directory, overrides)


def write_config(directory: str | Path, config: PipelineConfig) -> Path:
    """Write `config` as `directory`'s ``pipeline.json``; the file survives index saves."""
    from medfaq.index.lock import write_lock

    path = config_path(directory)
    with write_lock(directory):  # an index save beside this one copies the finished file
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(file_data(config), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
    return path


def update_config(
    directory: str | Path, change: Callable[[PipelineConfig | None], PipelineConfig | None]
) -> PipelineConfig | None:
    """Read, change and write `directory`'s ``pipeline.json`` under one write lock, so that no concurrent change is
    lost: ``change(saved)`` (None: there is no file yet) returns the config to write, or None to leave the file as
    it is. Returns what was written."""
    from medfaq.index.lock import write_lock

    with write_lock(directory):
        saved = config_bytes(directory)
        changed = change(None if saved is None else parse_config(saved, directory))
        if changed is not None:
            write_config(directory, changed)
    return changed


def store_threshold(directory: str | Path, config: PipelineConfig, value: float) -> Path:
    """Save `value` as the calibrated threshold of `config`'s configuration in `directory`'s ``pipeline.json``
    (abstention on; it replaces a threshold inherited from the encoder); the file's other settings and other
    configurations' thresholds stay as they are."""

    def calibrated(saved: PipelineConfig | None) -> PipelineConfig:
        saved = saved or PipelineConfig()
        thresholds = {**saved.thresholds, config.threshold_key: float(value)}
        inherited = {k: v for k, v in saved.inherited_thresholds.items() if k != config.threshold_key}
        return saved.replace(abstain=True, thresholds=thresholds, inherited_thresholds=inherited)

    update_config(directory, calibrated)
    return config_path(directory)
