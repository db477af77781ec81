"""The abstention thresholds models carry, and which of them an index inherits.

A bi-encoder or reranker calibrated by :mod:`retriever.decisions.abstention` keeps its threshold in ``threshold.json``
in its directory (:class:`ModelThreshold`); the stock encoders ship theirs in `STOCK_THRESHOLDS`, matched to an index by
its encoder's weights fingerprint. An index inherits them (:func:`model_thresholds`): `medfaq index build` writes them
into its ``pipeline.json`` marked as inherited, and reading a ``pipeline.json`` that is missing or lacks one fills it in
the same way (:func:`with_model_thresholds`), so that a threshold travels with the encoder."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from medfaq.common.runtime import MedfaqError, resolve_model
from medfaq.retriever.pipeline import PipelineConfig

THRESHOLD_FILE = "threshold.json"
STOCK_THRESHOLDS = Path(__file__).with_name("stock_thresholds.json")  # package data: {name: {fingerprint, ...}}


@dataclass
class ModelThreshold:
    """A model's abstention threshold: answer when the confidence `key` names is at least `value`."""

    value: float
    key: str
    confidence: str
    first_stage: str
    synonyms: str
    calibrated_on: dict[str, Any]
    counts: dict[str, int]
    development: dict[str, float] = field(default_factory=dict)

    def save(self, model_dir: str | Path) -> Path:
        path = Path(model_dir) / THRESHOLD_FILE
        path.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, model_dir: str | Path) -> ModelThreshold | None:
        """The threshold stored in `model_dir`, or None when it has none."""
        path = Path(model_dir) / THRESHOLD_FILE
        if not path.is_file():
            return None
        try:
            return cls(**json.loads(path.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, TypeError) as error:
            raise MedfaqError(f"{path} is not a valid threshold file: {error}") from None


def read_stock_thresholds(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The stock encoders' calibrations in `path` (default `STOCK_THRESHOLDS`): ``{name: {"fingerprint", "command",
    "threshold"}}``, empty without a file."""
    path = path or STOCK_THRESHOLDS
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise MedfaqError(f"{path} is not a valid stock threshold file: {error}") from None


def stock_threshold(fingerprint: str) -> tuple[ModelThreshold, str] | None:
    """The shipped threshold of the stock encoder whose weights have `fingerprint`, with where it comes from."""
    for name, entry in read_stock_thresholds().items():
        if fingerprint and entry.get("fingerprint") == fingerprint:
            try:
                return ModelThreshold(**entry["threshold"]), f"{STOCK_THRESHOLDS} ({name})"
            except (KeyError, TypeError) as error:
                raise MedfaqError(f"{STOCK_THRESHOLDS}: {name}'s entry is not a valid threshold: {error}") from None
    return None


def save_stock_threshold(name: str, fingerprint: str, threshold: ModelThreshold, command: str, path: Path) -> None:
    """Store (or replace) stock encoder `name`'s calibration in the stock threshold file `path`."""
    entries = read_stock_thresholds(path) | {
        name: {"fingerprint": fingerprint, "command": command, "threshold": asdict(threshold)}
    }
    path.write_text(json.dumps(dict(sorted(entries.items())), indent=2) + "\n", encoding="utf-8")


def model_thresholds(
    encoder: str, reranker: str | Path | None = None, fingerprint: str = ""
) -> dict[str, tuple[float, str]]:
    """The thresholds an index encoded by `encoder` (weights `fingerprint`) inherits, as ``{key: (value, where
    from)}``: the encoder's own (its ``threshold.json``, else the shipped one of the stock encoder with that
    fingerprint), and `reranker`'s when it was calibrated over that same encoder (its first stage)."""
    encoder_dir = Path(resolve_model(encoder))
    found: dict[str, tuple[float, str]] = {}
    own = ModelThreshold.load(encoder_dir) if encoder_dir.is_dir() else None
    if own is not None:
        found[own.key] = (own.value, str(encoder_dir / THRESHOLD_FILE))
    elif (stock := stock_threshold(fingerprint)) is not None:
        found[stock[0].key] = (stock[0].value, stock[1])
    corrected = ModelThreshold.load(reranker) if reranker is not None and Path(reranker).is_dir() else None
    if corrected is not None and Path(corrected.first_stage) == encoder_dir:
        found[corrected.key] = (corrected.value, str(Path(reranker) / THRESHOLD_FILE))
    return found


def with_model_thresholds(config: PipelineConfig, index_dir: str | Path) -> PipelineConfig:
    """`config` (the ``pipeline.json`` of the index in `index_dir`, or the defaults without one) with the thresholds
    its models carry (:func:`model_thresholds`: the index's encoder, and the reranker the config names, else the one
    ``medfaq setup`` trained) for every configuration it has none for, marked as inherited: what ``medfaq index
    build`` writes. Unchanged where `index_dir` holds no index or its encoder is not on this machine."""
    from medfaq.index.storage import is_index, read_manifest
    from medfaq.retriever.trained_models import set_up_reranker

    if not is_index(index_dir):
        return config
    try:
        manifest = read_manifest(Path(index_dir))
        reranker = resolve_model(config.reranker) if config.reranker else set_up_reranker()
        found = model_thresholds(manifest.encoder, reranker, manifest.encoder_fingerprint)
    except MedfaqError:  # a search says so in one line when it loads the model
        return config
    missing = {key: carried for key, carried in found.items() if key not in config.thresholds}
    if not missing:
        return config
    return config.replace(
        thresholds={**config.thresholds, **{key: value for key, (value, _) in missing.items()}},
        inherited_thresholds={**config.inherited_thresholds, **{key: origin for key, (_, origin) in missing.items()}},
    )
