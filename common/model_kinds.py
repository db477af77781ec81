"""What kind of model a directory holds (bi-encoder, student, cross-encoder, summarizer, question writer), read
from its files without loading it, and the check every loader makes of it: a model of one kind is refused, in one
line, where another is wanted (a bi-encoder taken for a summarizer writes word salad).

`medfaq train` declares the kind in the ``train_config.json`` it writes (``"kind": ...``). A directory saved before
models declared one is told by its files: an encoder's training config (``model_type``, a student's ``task``), a
summarizer's (``direction``: ``ask`` for the question writer), a classification head (a cross-encoder), a
sentence-transformers ``modules.json`` (a bi-encoder). A directory whose files say none of these is a plain model (a
Hugging Face backbone); each loader says whether it takes one.

Imports nothing beyond the standard library and `common.runtime`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from medfaq.common.runtime import MedfaqError

TRAIN_CONFIG = "train_config.json"  # beside every model `medfaq train` saves; it declares the model's kind
KIND_KEY = "kind"
BIENCODER, STUDENT, CROSSENCODER = "biencoder", "student", "crossencoder"
SUMMARIZER, QUESTION_WRITER = "summarizer", "question-writer"
KINDS = {
    BIENCODER: ("bi-encoder", "medfaq train biencoder"),
    STUDENT: ("student bi-encoder", "medfaq train student"),
    CROSSENCODER: ("cross-encoder", "medfaq train crossencoder"),
    SUMMARIZER: ("summarizer", "medfaq train summarizer"),
    QUESTION_WRITER: ("question writer", "medfaq train question-writer"),
}
"""Each kind: how a message names it, and the command that trains one."""
ENCODER_KINDS = (BIENCODER, STUDENT)  # what encodes texts into vectors: a student is a bi-encoder
PLAIN = "a plain model (no kind declared, and none its files show)"


def train_command(kind: str) -> str:
    """The `medfaq train ...` command that trains a model of `kind`."""
    return KINDS[kind][1]


def has_classifier_head(path: str | Path) -> bool:
    """True for a saved cross-encoder (a sequence-classification model, or a sentence-transformers CrossEncoder
    directory), False for a plain encoder."""
    directory = Path(path)
    config = _read_json(directory / "config.json")
    st_config = _read_json(directory / "config_sentence_transformers.json")
    if st_config.get("model_type") == "CrossEncoder":
        return True
    return any(str(name).endswith("ForSequenceClassification") for name in config.get("architectures") or [])


def model_kind(directory: str | Path) -> str | None:
    """The kind of the model in `directory` (one of `KINDS`): the one its ``train_config.json`` declares, else the
    one its files show; None for a plain model, or a directory that holds none."""
    path = Path(directory)
    saved = _read_json(path / TRAIN_CONFIG)
    declared = saved.get(KIND_KEY)
    if declared in KINDS:
        return declared
    if saved.get("model_type") in (BIENCODER, CROSSENCODER):  # an encoder's training config
        return STUDENT if saved.get("task") == "distill" else saved["model_type"]
    if "direction" in saved or "variant" in saved:  # a summarizer's training config
        return QUESTION_WRITER if saved.get("direction") == "ask" else SUMMARIZER
    if has_classifier_head(path):
        return CROSSENCODER
    return BIENCODER if (path / "modules.json").is_file() else None


def noun(kind: str) -> str:
    """`kind` as a message names it: ``bi-encoder``, ``question writer``, ..."""
    return KINDS[kind][0]


def describe(kind: str | None) -> str:
    """`kind` with its article (``a bi-encoder``), or what a plain model is."""
    return f"a {noun(kind)}" if kind in KINDS else PLAIN


def check_model_kind(location: str | Path, wanted: str | tuple[str, ...], name: Any = None, plain: bool = True) -> None:
    """A one-line error when the local model directory `location` holds a model of another kind than `wanted` (one
    kind or several, the first the one to name), naming the kind found, the kind wanted and how to train one; a plain
    model passes where `plain`. A hub id (no local directory) passes: its files are not here to tell."""
    path = Path(location)
    if not path.is_dir():
        return
    accepted = (wanted,) if isinstance(wanted, str) else wanted
    found = model_kind(path)
    if found in accepted or (found is None and plain):
        return
    named = " or ".join(describe(kind) for kind in accepted if kind != STUDENT or len(accepted) == 1)  # a bi-encoder
    raise MedfaqError(
        f"{name or location} is {describe(found)}, not {named}: pass {describe(accepted[0])} "
        f"(`{train_command(accepted[0])}` trains one)"
    )


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; an empty one when the file is missing, unreadable or holds no object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
