"""``pipeline.json``, the :class:`~retriever.pipeline.PipelineConfig` saved beside an index: the one module that reads
and writes it. Everything else asks here: :func:`read_config` for the settings, :func:`config_bytes` and
:func:`parse_config` to compare what is on disk with what was loaded, :func:`write_config`, and
:func:`update_config` (:func:`store_threshold`) to change it under the index's write lock."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from medfaq.common.runtime import MedfaqError
from medfaq.retriever.pipeline import PipelineConfig
from medfaq.retriever.threshold_files import with_model_thresholds

PIPELINE_FILE = "pipeline.json"


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


def parse_config(saved: bytes | None, directory: str | Path) -> PipelineConfig:
    """The settings of `directory`'s ``pipeline.json`` read as `saved` (None: there is none, the defaults), with the
    abstention thresholds the index's models carry for every configuration the file has none for
    (:func:`~retriever.threshold_files.with_model_thresholds`): a missing or partial file still abstains. An invalid
    file is a one-line error naming it."""
    config = PipelineConfig() if saved is None else _parsed(saved, directory)
    return with_model_thresholds(config, directory)


def _parsed(saved: bytes, directory: str | Path) -> PipelineConfig:
    try:
        data = json.loads(saved.decode("utf-8"))
        if not isinstance(data, dict):
            raise MedfaqError(f"expected a JSON object of settings, got {type(data).__name__}")
        return PipelineConfig.from_dict(data)
    except (UnicodeDecodeError, json.JSONDecodeError, TypeError, MedfaqError) as error:
        raise MedfaqError(f"{config_path(directory)} is not a valid pipeline config: {error}") from None


def read_config(directory: str | Path) -> PipelineConfig:
    """``pipeline.json`` of `directory` (an index directory), or the defaults when there is none, as
    :func:`parse_config` reads it."""
    return parse_config(config_bytes(directory), directory)


def write_config(directory: str | Path, config: PipelineConfig) -> Path:
    """Write `config` as `directory`'s ``pipeline.json``; the file survives index saves."""
    from medfaq.index.faq_index import write_lock

    path = config_path(directory)
    with write_lock(directory):  # an index save beside this one copies the finished file
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(config.to_dict(), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
    return path


def update_config(
    directory: str | Path, change: Callable[[PipelineConfig | None], PipelineConfig | None]
) -> PipelineConfig | None:
    """Read, change and write `directory`'s ``pipeline.json`` under one write lock, so that no concurrent change is
    lost: ``change(saved)`` (None: there is no file yet) returns the config to write, or None to leave the file as
    it is. Returns what was written."""
    from medfaq.index.faq_index import write_lock

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
