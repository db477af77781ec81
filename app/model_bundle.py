"""Models that travel as one file: `medfaq models export`, `models import` (and `medfaq setup --from`), `models list`.

Train once on a GPU machine, deploy to CPU servers. The file is a tar archive (compressed where its name says so:
``.tar.gz``/``.tgz``, ``.tar.bz2``, ``.tar.xz``) whose first member is ``manifest.json``: the format and its version,
the medfaq version that wrote it, the home it was written from, and per item (a model under ``models/NAME/``, the
set-up's MedQuAD index under ``indexes/NAME/``) its name, kind, the sha256 of each file (its fingerprint), its
training config, its abstention threshold, the checks it passed, and for the index the decisions recorded beside it
(``pipeline.json``, ``likelihood.json``, ``reranker.json``). What a machine makes again on first use is left out:
ONNX exports, CTranslate2 conversions, a training run's ``last/`` checkpoint, lock and temporary files.

An import extracts into a temporary folder inside ``$MEDFAQ_HOME`` (the same file system), verifies the format
version and every checksum, rewrites the paths under the exporting home that the JSON files record (an index's
encoder, a reranker's first stage, the decisions' models) to this home, and only then renames each item into
place: a damaged, truncated, foreign or newer file, or one whose members reach outside its folders, installs
nothing. An item that exists and differs is replaced only with `force`.

Weights are safetensors, which record no device: the loaders put them on the machine's own (`choose_device`: the
CPU where there is no GPU), so a model trained on a GPU loads on a CPU server.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import tarfile
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import IO, Any

from medfaq.common.model_kinds import TRAIN_CONFIG, model_kind
from medfaq.common.runtime import CHECKPOINT_DIR, MedfaqError, indexes_dir, medfaq_home, models_dir, utc_timestamp

FORMAT = "medfaq-models"
FORMAT_VERSION = 1  # raised when the layout or the manifest changes so that an older medfaq cannot read it
MANIFEST = "manifest.json"
MODELS, INDEXES = "models", "indexes"  # the folders of the file, and of $MEDFAQ_HOME, items go into
COMPRESSIONS = {".tar.gz": "gz", ".tgz": "gz", ".tar.bz2": "bz2", ".tbz2": "bz2", ".tar.xz": "xz", ".txz": "xz"}
"""The compression a file name asks for; any other name is a plain tar archive."""
REMADE = ("medfaq-onnx", "ct2-int8")  # folders a machine derives from a model on first use (ONNX, CTranslate2)
CHECKPOINTS = {CHECKPOINT_DIR, f"{CHECKPOINT_DIR}.tmp", f"{CHECKPOINT_DIR}.old"}  # a run's state for --resume
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
SHA256 = re.compile(r"[0-9a-f]{64}")
CHUNK = 1 << 20
MAX_MANIFEST = 64 << 20  # bytes: a manifest lists files, a larger first member is not one
READ_ERRORS = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile)


def shipped_files(directory: Path) -> Iterator[tuple[str, Path]]:
    """(path relative to `directory`, file) of every file an item ships, in order: all but what is remade on
    first use, a run's checkpoint, and dot, lock and temporary files."""
    for path in sorted(directory.rglob("*")):
        parts = path.relative_to(directory).parts
        left_out = parts[0] in CHECKPOINTS or any(part.startswith((".", *REMADE)) for part in parts)
        if not left_out and not path.name.endswith((".lock", ".tmp", ".partial")) and path.is_file():
            yield PurePosixPath(*parts).as_posix(), path


def copy_hashed(source: IO[bytes], sink: IO[bytes] | None = None) -> str:
    """sha256 of what `source` holds, copied into `sink` on the way (when given)."""
    digest = hashlib.sha256()
    while chunk := source.read(CHUNK):
        digest.update(chunk)
        if sink is not None:
            sink.write(chunk)
    return digest.hexdigest()


def file_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every file `directory` ships (:func:`shipped_files`), by relative path."""
    hashes = {}
    for relative, path in shipped_files(directory):
        with path.open("rb") as handle:
            hashes[relative] = copy_hashed(handle)
    return hashes


def fingerprint(files: dict[str, str]) -> str:
    """One sha256 over an item's files and their hashes: two items with the same fingerprint hold the same bytes."""
    return hashlib.sha256("".join(f"{name}\0{files[name]}\n" for name in sorted(files)).encode()).hexdigest()


def model_entry(directory: Path, hashed: bool = True) -> dict[str, Any]:
    """A model's manifest entry: its kind, files (with `hashed`, their sha256 and fingerprint), training config,
    abstention threshold (:mod:`retriever.decisions.abstention`) and the checks its ONNX export passed when it was
    made."""
    from medfaq.index.onnx.graph import EXPORT_DIR, ExportInfo
    from medfaq.retriever.decisions.abstention import ModelThreshold
    from medfaq.retriever.decisions.stage_choice import read_record

    training = read_record(directory / TRAIN_CONFIG)
    threshold = ModelThreshold.load(directory)
    export = ExportInfo.read(directory / EXPORT_DIR)
    return {
        "name": directory.name,
        "kind": model_kind(directory) or "model",
        "place": MODELS,
        **_contents(directory, hashed),
        "training": training,
        "threshold": asdict(threshold) if threshold else None,
        "checks": {"onnx": export.checks} if export and export.checks else {},
    }


def index_entry(directory: Path, hashed: bool = True) -> dict[str, Any]:
    """The set-up index's manifest entry: its files, the encoder it was encoded by, the check that encoder's runtime
    passed, and the decisions recorded beside it."""
    from medfaq.index.storage import read_manifest
    from medfaq.retriever.decisions.stage_choice import read_record

    manifest = read_manifest(directory)
    if manifest.backend.get("name", "faiss") != "faiss":
        raise MedfaqError(
            f"index {directory} keeps its vectors in {manifest.backend['name']}, outside its directory: it cannot "
            "travel in a file (`medfaq index migrate` it to faiss first)"
        )
    decisions = {path.name: record for path in decision_files(directory) if (record := read_record(path)) is not None}
    return {
        "name": directory.name,
        "kind": "index",
        "place": INDEXES,
        **_contents(directory, hashed),
        "encoder": manifest.encoder,
        "encoder_fingerprint": manifest.encoder_fingerprint,
        "checks": {"encoder": manifest.encoder_check} if manifest.encoder_check else {},
        "decisions": decisions,
    }


def decision_files(directory: Path) -> tuple[Path, ...]:
    """The files beside the index at `directory` that record how its pipeline was decided."""
    from medfaq.retriever.decisions import likelihood_choice, reranker_choice
    from medfaq.retriever.pipeline_file import config_path

    return config_path(directory), directory / likelihood_choice.CHOICE_FILE, directory / reranker_choice.CHOICE_FILE


def _contents(directory: Path, hashed: bool) -> dict[str, Any]:
    size = sum(path.stat().st_size for _, path in shipped_files(directory))
    if not hashed:
        return {"bytes": size}
    files = file_hashes(directory)
    return {"bytes": size, "fingerprint": fingerprint(files), "files": files}


def shipped_items(everything: bool = False) -> tuple[list[Path], Path | None]:
    """The model directories an export ships and the set-up's MedQuAD index (None before it is built). Models: those
    of the set-up saved (`saved_models`), and those the index is encoded by or its pipeline names under the models
    directory; with `everything`, every model `medfaq train` saved under it."""
    from medfaq.app.setup_plan import saved_models
    from medfaq.retriever.trained_models import FAQ_INDEX, index_built

    index = indexes_dir() / FAQ_INDEX
    index = index if index_built(index) else None
    found = trained_models() if everything else saved_models() + (_named_by(index) if index else [])
    if not found:
        which = "trained model" if everything else "model of `medfaq setup`"
        raise MedfaqError(
            f"nothing to export: no {which} under {models_dir()} (run `medfaq setup`"
            f"{')' if everything else ', or pass --all for every trained model)'}"
        )
    return sorted(set(found), key=found.index), index


def trained_models() -> list[Path]:
    """Every model directory under the models directory that `medfaq train` saved and finished."""
    from medfaq.retriever.trained_models import model_ready

    found = sorted(models_dir().iterdir()) if models_dir().is_dir() else []
    return [p for p in found if not p.name.startswith(".") and model_ready(p) and (p / TRAIN_CONFIG).is_file()]


def _named_by(index: Path) -> list[Path]:
    """The model directories under the models directory that the index is encoded by or its pipeline names; an
    encoder elsewhere on this machine cannot travel with it (a one-line error)."""
    from medfaq.common.runtime import local_model_dir
    from medfaq.index.storage import read_manifest
    from medfaq.retriever.pipeline_file import read_config

    encoder = read_manifest(index).encoder
    config = read_config(index)
    root = models_dir().resolve()
    named = []
    for name in (encoder, config.summarizer, config.reranker):
        path = local_model_dir(name)
        if path is not None and path.is_relative_to(root):
            named.append(models_dir() / path.relative_to(root).parts[0])
        elif name == encoder and path is not None:
            raise MedfaqError(
                f"index {index} is encoded by {encoder}, outside {models_dir()}: it cannot travel with the models "
                "(copy the encoder under the models directory and build the index with it)"
            )
    return named


def compression(file: Path) -> str:
    """The tar compression `file`'s name asks for ("" for none)."""
    name = file.name.lower()
    return next((kind for suffix, kind in COMPRESSIONS.items() if name.endswith(suffix)), "")


def export_models(file: Path, everything: bool = False) -> dict[str, Any]:
    """Write the models (:func:`shipped_items`) and the set-up index into `file`, atomically (a partial file renamed
    into place); returns the manifest written. The index is read under its write lock."""
    from medfaq.index.lock import write_lock

    models, index = shipped_items(everything)
    file = Path(file).expanduser()
    sources = [*models, *([index] if index else [])]
    for source in sources:
        if file.resolve().is_relative_to(source.resolve()):
            raise MedfaqError(f"the output file {file} lies inside {source}, which it exports: write it elsewhere")
    home = medfaq_home()
    with write_lock(index) if index else contextlib.nullcontext():
        entries = [*map(model_entry, models), *([index_entry(index)] if index else [])]
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "medfaq_version": metadata.version("medfaq"),
            "created": utc_timestamp(),
            "homes": list(dict.fromkeys([str(home.absolute()), str(home.resolve())])),
            "items": entries,
        }
        partial = file.with_name(f".{file.name}.{os.getpid()}.partial")
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            with tarfile.open(partial, f"w:{compression(file)}", dereference=True) as archive:
                data = json.dumps(manifest, indent=2).encode() + b"\n"
                info = tarfile.TarInfo(MANIFEST)
                info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
                archive.addfile(info, io.BytesIO(data))
                for entry, source in zip(entries, sources, strict=True):
                    for relative, path in shipped_files(source):
                        archive.add(path, arcname=f"{entry['place']}/{entry['name']}/{relative}", filter=_anonymous)
            os.replace(partial, file)
        except OSError as error:
            raise MedfaqError(f"cannot write {file}: {error}") from None
        finally:
            partial.unlink(missing_ok=True)
    return manifest


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """A member without the exporting machine's user and group."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def read_manifest_of(file: Path) -> dict[str, Any]:
    """The manifest of the model file `file`, checked (:func:`check_manifest`), without reading the rest."""
    with _opened(file) as archive:
        return _first_manifest(archive, file)


@contextlib.contextmanager
def _opened(file: Path) -> Iterator[tarfile.TarFile]:
    """`file` as a tar stream (compression detected); a missing file, or one that is no tar archive, in one line."""
    file = Path(file).expanduser()
    if not file.is_file():
        raise MedfaqError(f"no model file at {file}" + (" (it is a directory)" if file.is_dir() else ""))
    try:
        archive = tarfile.open(file, "r|*")
    except (*READ_ERRORS, OSError) as error:
        raise MedfaqError(f"{file} is not a medfaq model file: not a readable tar archive ({error})") from None
    with archive:
        yield archive


def _first_manifest(archive: tarfile.TarFile, file: Path) -> dict[str, Any]:
    try:
        first = archive.next()
        handle = archive.extractfile(first) if first is not None and first.isfile() else None
        listed = handle is not None and first.name == MANIFEST and first.size <= MAX_MANIFEST
        data = handle.read() if listed else None
    except (*READ_ERRORS, OSError) as error:
        raise MedfaqError(f"{file} is not a medfaq model file: not a readable tar archive ({error})") from None
    if data is None:
        raise MedfaqError(f"{file} is not a medfaq model file: it does not start with a {MANIFEST}")
    try:
        manifest = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        manifest = None
    return check_manifest(manifest, file)


def check_manifest(manifest: Any, file: Path) -> dict[str, Any]:
    """`manifest` when it is a medfaq model manifest this medfaq reads; else a one-line error: a foreign file, a
    newer format version, or an item whose name or file paths would reach outside its folder."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise MedfaqError(f"{file} is not a medfaq model file: its {MANIFEST} is not a {FORMAT} manifest")
    version = manifest.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise MedfaqError(f"{file}: its {MANIFEST} has no valid format_version ({version!r})")
    if version > FORMAT_VERSION:
        raise MedfaqError(
            f"{file} is in model file format {version}, written by medfaq {manifest.get('medfaq_version', '?')}; "
            f"this medfaq reads format {FORMAT_VERSION} and older: upgrade medfaq to import it"
        )
    items, homes = manifest.get("items"), manifest.get("homes")
    if not isinstance(items, list) or not isinstance(homes, list) or not all(isinstance(h, str) for h in homes):
        raise MedfaqError(f"{file}: its {MANIFEST} lists no items or no homes")
    for item in items:
        bad = _bad_item(item)
        if bad:
            raise MedfaqError(f"{file}: its {MANIFEST} has an item {bad}: refused, nothing installed")
    if len({(item["place"], item["name"]) for item in items}) < len(items):
        raise MedfaqError(f"{file}: its {MANIFEST} lists an item twice: refused, nothing installed")
    return manifest


def _bad_item(item: Any) -> str:
    """What is wrong with a manifest item ("" when nothing is)."""
    if not isinstance(item, dict) or not isinstance(item.get("files"), dict):
        return "without files"
    if not isinstance(item.get("kind"), str) or not isinstance(item.get("bytes"), int):
        return f"without a kind or a size ({item.get('name')!r})"
    if item.get("place") not in (MODELS, INDEXES) or not NAME.fullmatch(str(item.get("name", ""))):
        return f"with a bad name or place ({item.get('place')!r}, {item.get('name')!r})"
    for name, digest in item["files"].items():
        if _unsafe(name) or not SHA256.fullmatch(str(digest)):
            return f"file {name!r} with a path outside its folder or no sha256"
    return ""


def _unsafe(name: str) -> bool:
    """Whether a member or file path could land outside the folder it is extracted into."""
    path = PurePosixPath(name)
    return not name or "\\" in name or path.is_absolute() or ".." in path.parts or name.startswith("~")


def import_models(file: Path, force: bool = False, dry_run: bool = False) -> list[tuple[dict[str, Any], str]]:
    """Install the items of the model file `file` into ``$MEDFAQ_HOME`` (see the module docstring); returns each
    item with what happened to it: installed, replaced, unchanged (the same bytes are there), or with `dry_run`
    what would happen (nothing is installed). An item that exists and differs is refused, before anything is
    installed, unless `force`."""
    home = medfaq_home()
    try:
        home.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".import-", dir=home))
    except OSError as error:
        raise MedfaqError(f"cannot import into {home}: {error}") from None
    try:
        manifest = _extract(Path(file).expanduser(), staging)
        target_home = str(home.absolute())
        plan = []
        for entry in manifest["items"]:
            staged = staging / entry["place"] / entry["name"]
            relocate(staged, manifest["homes"], target_home)
            target = home / entry["place"] / entry["name"]
            state = "new" if not target.exists() else "same" if file_hashes(target) == file_hashes(staged) else "other"
            plan.append((entry, staged, target, state))
        differ = [f"{entry['place']}/{entry['name']}" for entry, _, _, state in plan if state == "other"]
        if differ and not force and not dry_run:
            raise MedfaqError(
                f"{', '.join(differ)} already in {home} and different from the file's: nothing installed "
                "(--force replaces them)"
            )
        if dry_run:
            return [(entry, _would(state, force)) for entry, _, _, state in plan]
        return [(entry, _install(staged, target, state)) for entry, staged, target, state in plan]
    except OSError as error:
        raise MedfaqError(f"cannot import {file} into {home}: {error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _would(state: str, force: bool) -> str:
    if state == "other":
        return "would replace" if force else "refused: differs from the installed one (--force replaces it)"
    return "unchanged" if state == "same" else "would install"


def _install(staged: Path, target: Path, state: str) -> str:
    """Rename `staged` into place as `target` (an index under its write lock, as the index swaps its saves)."""
    from medfaq.index.lock import write_lock
    from medfaq.index.storage import swap_in

    if state == "same":
        return "unchanged"
    target.parent.mkdir(parents=True, exist_ok=True)
    with write_lock(target) if target.parent.name == INDEXES else contextlib.nullcontext():
        swap_in(staged, target)
    return "installed" if state == "new" else "replaced"


def _extract(file: Path, staging: Path) -> dict[str, Any]:
    """Extract the model file into `staging`, checking each member against the manifest as it is written; every
    refusal is one line and leaves only `staging` behind."""
    with _opened(file) as archive:
        manifest = _first_manifest(archive, file)
        expected = {
            f"{entry['place']}/{entry['name']}/{name}": digest
            for entry in manifest["items"]
            for name, digest in entry["files"].items()
        }
        members = iter(archive)
        next(members)  # the manifest, read already
        try:
            for member in members:
                _extract_member(archive, member, expected, staging, file)
        except READ_ERRORS as error:
            raise MedfaqError(f"{file} is damaged or truncated: {error}; nothing installed") from None
        except (OSError, ValueError) as error:
            raise MedfaqError(f"cannot import {file}: {error}; nothing installed") from None
    missing = [name for name in expected if not (staging / name).is_file()]
    if missing:
        raise MedfaqError(
            f"{file} is damaged or truncated: {len(missing)} file(s) its manifest lists are missing (the first: "
            f"{missing[0]}); nothing installed"
        )
    return manifest


def _extract_member(
    archive: tarfile.TarFile, member: tarfile.TarInfo, expected: dict[str, str], staging: Path, file: Path
) -> None:
    if _unsafe(member.name):
        raise MedfaqError(f"{file} holds a member outside its folders ({member.name!r}): refused, nothing installed")
    if member.isdir():
        return
    if not member.isfile():
        raise MedfaqError(f"{file} holds a link or special file ({member.name!r}): refused, nothing installed")
    name = PurePosixPath(member.name).as_posix()
    target = staging / name
    if name not in expected or target.exists():
        raise MedfaqError(f"{file} holds {name!r}, which its manifest does not list: refused, nothing installed")
    target.parent.mkdir(parents=True, exist_ok=True)
    source = archive.extractfile(member)
    assert source is not None  # a regular file
    with target.open("xb") as sink:
        digest = copy_hashed(source, sink)
    if digest != expected[name]:
        raise MedfaqError(f"{file} is damaged: {name} does not match its sha256; nothing installed")


def relocate(directory: Path, homes: list[str], home: str) -> None:
    """Rewrite, in every JSON file under `directory`, the paths under one of the exporting `homes` to `home`."""
    moved = [old for old in sorted(homes, key=len, reverse=True) if old != home]
    needles = [json.dumps(old)[1:-1].encode() for old in moved]
    for path in directory.rglob("*.json"):
        raw = path.read_bytes()
        if not any(needle in raw for needle in needles):
            continue
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue  # not JSON after all: left as it came
        path.write_text(json.dumps(_moved(data, moved, home), indent=2) + "\n", encoding="utf-8")


def _moved(value: Any, homes: list[str], home: str) -> Any:
    if isinstance(value, str):
        old = next((old for old in homes if value == old or value.startswith(old + "/")), None)
        return value if old is None else home + value[len(old) :]
    if isinstance(value, dict):
        return {key: _moved(item, homes, home) for key, item in value.items()}
    if isinstance(value, list):
        return [_moved(item, homes, home) for item in value]
    return value


def installed_items() -> list[dict[str, Any]]:
    """What this home holds that an export ships (entries without hashes): every trained model under the models
    directory and the set-up's MedQuAD index, each marked ``setup`` where `medfaq models export` ships it without
    --all."""
    from medfaq.app.setup_plan import saved_models
    from medfaq.retriever.trained_models import FAQ_INDEX, index_built

    default = saved_models()
    models = sorted(set(default + trained_models()))
    entries = [{**model_entry(path, hashed=False), "setup": path in default} for path in models]
    index = indexes_dir() / FAQ_INDEX
    return entries + ([{**index_entry(index, hashed=False), "setup": True}] if index_built(index) else [])


def describe(entry: dict[str, Any]) -> str:
    """One line of an item: where it goes, its kind and size, its fingerprint, its threshold or decisions."""
    parts = [f"{entry['place']}/{entry['name']}", entry["kind"], f"{entry['bytes'] / 1e6:.1f} MB"]
    if "fingerprint" in entry:
        parts.append(f"sha256 {entry['fingerprint'][:12]}")
    threshold = entry.get("threshold")
    if isinstance(threshold, dict) and isinstance(threshold.get("value"), int | float):
        parts.append(f"abstains below {threshold['value']:.4f} ({threshold['key']})")
    decisions = entry.get("decisions") if isinstance(entry.get("decisions"), dict) else {}
    for name in ("likelihood", "reranker"):
        record = decisions.get(f"{name}.json")
        if isinstance(record, dict):
            parts.append(f"{name} {'on' if record.get('on') else 'off'} (decided {record.get('decided', '?')})")
    return ", ".join(parts)
