"""An index directory on disk: its manifest, the parts it holds, checksums, the atomic save and the write lock.

Directory layout::

    manifest.json    IndexManifest: encoder, dimension, fields, kind, counts, sha256 of every file, backend section
    records.jsonl    one FaqRecord per line
    keys.npy         int64 row key of each record line (the key the vector store and BM25 use)
    records.offsets.npy, records.ids   where each line starts, and its FAQ id (index/record_table.py)
    vectors/         the vector backend's files
    bm25/            bm25s files + keys.npy
    concepts.jsonl   the concept lexicon FAQs are encoded with, when the index has one (index/concepts.py)
    phrasings.jsonl  other wordings of FAQ questions, each searched as its FAQ (index/phrasings.py), when any
    *.json           sidecar settings of other packages (e.g. pipeline.json); kept across saves

Saves write everything into a temporary directory beside the target and swap it in with renames, so a crash or
Ctrl-C during a save leaves the previous index as it was, and readers see the old or the new index, never a mix (a
load that races a save reads again).

Every write (a save over an existing index, sidecar saves by other packages) holds an exclusive file lock,
``.NAME.lock`` beside the directory (index/lock.py); a save of parts loaded before another write changed the
directory is refused. :func:`disk_version` tells a long-running reader that a newer index is on disk.

A load reads what every search needs (manifest, ids, vectors) and leaves the rest for first use: a record is
parsed when a hit returns it, and BM25 (bm25s, scipy) is imported when a search or a change needs it, from the
bytes of its files read at load time.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from medfaq.common.runtime import IndexCorrupt, MedfaqError
from medfaq.index import verified
from medfaq.index.collections import read_records
from medfaq.index.concepts import CONCEPTS_FILE, ConceptLexicon
from medfaq.index.lock import write_lock
from medfaq.index.phrasings import PhrasingTable
from medfaq.index.record_table import KEYS as KEYS  # the index's layout, named here too
from medfaq.index.record_table import RECORDS, RecordTable
from medfaq.index.records import FaqRecord
from medfaq.index.vector_store import VECTOR_BACKENDS, VectorStore, backend_class

if TYPE_CHECKING:  # bm25s (scipy) is imported when an index needs it
    from medfaq.index.bm25_store import Bm25Index

logger = logging.getLogger("medfaq.index")

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
VECTORS_DIR = "vectors"
BM25_DIR = "bm25"
LOAD_ATTEMPTS = 3  # a load that races a save reads the new index again


@dataclass
class IndexManifest:
    """What an index directory holds; written as manifest.json and checked on load.

    `encoder_fingerprint` identifies the encoder's weights (empty in indexes built before it was recorded);
    `encoder_backend` the runtime that encoded the FAQs (torch, onnx, onnx-int8; empty before it was recorded);
    `encoder_check` how that runtime's graph agreed with its source (index/onnx/check.py; empty for torch);
    `generation` counts the saves of this directory; `sources` counts FAQs per source (for `index info`);
    `concepts` describes the concept lexicon FAQs are encoded with (empty: none); `adaptation` records what
    `medfaq index adapt` added and the development numbers it decided by (retriever/decisions/adaptation.py;
    empty: none).
    """

    encoder: str
    dimension: int
    fields: str
    kind: str
    backend: dict[str, Any]
    counts: dict[str, int] = field(default_factory=dict)
    checksums: dict[str, str] = field(default_factory=dict)
    created: str = ""
    updated: str = ""
    next_key: int = 0
    format_version: int = FORMAT_VERSION
    encoder_fingerprint: str = ""
    generation: int = 0
    sources: dict[str, int] = field(default_factory=dict)
    concepts: dict[str, Any] = field(default_factory=dict)
    encoder_backend: str = ""
    encoder_check: dict[str, Any] = field(default_factory=dict)
    adaptation: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IndexManifest:
        names = set(cls.__dataclass_fields__)
        return cls(**{key: value for key, value in data.items() if key in names})


class IndexParts:
    """What an index is made of, in memory: the manifest, records, vectors, BM25, the concept lexicon and the
    phrasings, and the directory they were loaded from or last saved to (`origin`) with its version then."""

    def __init__(
        self,
        manifest: IndexManifest,
        records: RecordTable,
        store: VectorStore,
        bm25: Bm25Index | dict[str, bytes],
        concepts: ConceptLexicon | bytes | None = None,
        phrasings: PhrasingTable | None = None,
    ) -> None:
        """`bm25`: the index, or its saved files (name -> bytes), loaded on first use; `concepts`: the lexicon, or
        its saved bytes, parsed on first use (a search that does not rerank never needs it)."""
        self.manifest = manifest
        self.records = records
        self.store = store
        self.phrasings = phrasings or PhrasingTable()
        self._bm25 = bm25
        self._concepts = concepts
        self.origin: Path | None = None
        self.version = ""

    @property
    def bm25(self) -> Bm25Index:
        """The BM25 index, loaded on first use (two threads that race here both load it; either result serves)."""
        bm25 = self._bm25
        if isinstance(bm25, dict):
            from medfaq.index.bm25_store import Bm25Index

            bm25 = self._bm25 = Bm25Index.from_files(bm25)
        return bm25

    @bm25.setter
    def bm25(self, bm25: Bm25Index) -> None:
        self._bm25 = bm25

    def bm25_rows(self) -> int:
        """How many rows BM25 indexes, without loading it."""
        bm25 = self._bm25
        if isinstance(bm25, dict):
            from medfaq.index.bm25_store import KEYS_FILE

            return int((np.load(io.BytesIO(bm25[KEYS_FILE]), allow_pickle=False) >= 0).sum())
        return len(bm25)

    @property
    def concepts(self) -> ConceptLexicon | None:
        """The concept lexicon FAQs are encoded with (None: the index has none)."""
        if isinstance(self._concepts, bytes):
            try:
                self._concepts = ConceptLexicon.parse(self._concepts, self.manifest.concepts)
            except (ValueError, TypeError) as error:
                where = self.origin or "this index"
                raise IndexCorrupt(f"index {where} has a corrupt {CONCEPTS_FILE} ({error}); rebuild it") from None
        return self._concepts

    def with_vectors(self, manifest: IndexManifest, store: VectorStore) -> IndexParts:
        """A copy under `manifest` whose vectors are `store`: records and phrasings copied, BM25 and the lexicon
        shared, `origin` and `version` kept (saving it in place checks for other writes)."""
        copy = IndexParts(manifest, self.records.copy(), store, self._bm25, self._concepts, self.phrasings.copy())
        copy.origin, copy.version = self.origin, self.version
        return copy

    def info(self) -> dict[str, Any]:
        """The manifest plus per-source counts, for `medfaq index info`."""
        return _described(self.manifest, self.version, source_counts(self.records.values()))

    def save(self, directory: str | Path, timeout: float | None = None) -> Path:
        """Write the parts to `directory` atomically (temporary directory beside it, then rename), under its write
        lock (see :func:`write_lock`; `timeout` in seconds).

        Saving parts loaded from `directory` is refused when another write changed the directory since the load
        (nothing is written): load it again and repeat the change.
        """
        target = check_index_target(directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        with write_lock(target, timeout):
            if self.origin == target and disk_version(target) != self.version:
                raise MedfaqError(
                    f"index {target} was changed by another write after it was loaded; nothing was saved "
                    "(load it again and repeat the change)"
                )
            self._save_locked(target)
        logger.info("saved %d FAQs to %s", len(self.records), target)
        return target

    def _save_locked(self, target: Path) -> None:
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.saving-"))
        staging.chmod(0o777 & ~_umask())  # mkdtemp makes it private; the index gets normal permissions
        try:
            self._write_parts(staging)
            if target.is_dir():
                for sidecar in target.glob("*.json"):
                    if sidecar.name != MANIFEST:
                        shutil.copy2(sidecar, staging / sidecar.name)
            manifest = self.manifest
            manifest.backend = {**manifest.backend, **self.store.backend_config()}
            counts = {"records": len(self.records), "vectors": len(self.store), "bm25": self.bm25_rows()}
            manifest.counts = {**counts, "phrasings": len(self.phrasings)}
            manifest.sources = source_counts(self.records.values())
            manifest.checksums = _checksums(staging)
            manifest.generation = max(manifest.generation, _manifest_generation(target)) + 1
            text = json.dumps(manifest.to_dict(), indent=2) + "\n"
            (staging / MANIFEST).write_text(text, encoding="utf-8")
            replaced = _replaced_backend(target, manifest.backend)
            swap_in(staging, target)
            self.origin, self.version = target, _version_of(text.encode("utf-8"))
            if replaced:
                backend_class(replaced["name"]).discard(replaced, manifest.backend)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def _write_parts(self, staging: Path) -> None:
        """Every part's files in `staging` (BM25 and the lexicon written back as read where never parsed)."""
        self.records.save(staging)
        self.phrasings.save(staging)
        self.store.save(staging / VECTORS_DIR)
        if isinstance(self._bm25, dict):
            _write_files(self._bm25, staging / BM25_DIR)
        else:
            self._bm25.save(staging / BM25_DIR)
        if isinstance(self._concepts, bytes):
            (staging / CONCEPTS_FILE).write_bytes(self._concepts)
        elif self._concepts is not None:
            self._concepts.save(staging / CONCEPTS_FILE)


def load_parts(
    directory: str | Path, verify: bool = True, check: Callable[[IndexManifest], None] | None = None
) -> IndexParts:
    """Read the index saved in `directory`; `check` may refuse its manifest before anything else is read.

    A load that races a save (the directory's version changes while it is read) reads the new index; after
    `LOAD_ATTEMPTS` raced reads it reads once more under the write lock, which holds saves off.
    """
    path = Path(directory).expanduser()
    _restore_interrupted_swap(path)
    for _ in range(LOAD_ATTEMPTS):
        before = disk_version(path)
        try:
            parts = _load_once(path, verify, check)
        except MedfaqError:
            swapping = not path.exists() and _backup_name(path).is_dir()  # a save between its two renames
            if disk_version(path) == before and not swapping:
                raise
            _restore_interrupted_swap(path)  # waits for that save under the write lock
            continue
        if disk_version(path) == parts.version:
            return parts
    with write_lock(path):
        _restore_interrupted_swap(path)
        return _load_once(path, verify, check)


def _load_once(path: Path, verify: bool, check: Callable[[IndexManifest], None] | None) -> IndexParts:
    manifest, version = _read_manifest_versioned(path)
    if check is not None:
        check(manifest)
    if verify:
        verify_checksums(path, manifest)
    try:
        records = RecordTable.open(path)
        store = backend_class(manifest.backend.get("name", "faiss")).load(path / VECTORS_DIR, manifest.backend)
        bm25 = _read_files(path / BM25_DIR)
        concepts = (path / CONCEPTS_FILE).read_bytes() if manifest.concepts else None
        phrasings = PhrasingTable.load(path)
    except MedfaqError:
        raise
    except Exception as error:  # any unreadable part means the directory is damaged
        raise IndexCorrupt(f"index {path} is corrupt ({type(error).__name__}: {error}); rebuild it") from None
    if store.dim != manifest.dimension:
        raise IndexCorrupt(
            f"index {path} is inconsistent: its manifest names {manifest.dimension}-d encoder "
            f"{manifest.encoder!r} but its vectors are {store.dim}-d; rebuild it"
        )
    parts = IndexParts(manifest, records, store, bm25, concepts, phrasings)
    parts.origin, parts.version = path.resolve(), version
    return parts


def index_info(directory: str | Path) -> dict[str, Any]:
    """What `medfaq index info` shows, read from the manifest alone (the records too for an index saved before
    the manifest counted sources); vectors and BM25 are not opened."""
    path = Path(directory).expanduser()
    _restore_interrupted_swap(path)
    manifest, version = _read_manifest_versioned(path)
    sources = manifest.sources
    if not sources and manifest.counts.get("records"):
        sources = source_counts(read_records(path / RECORDS))
    return _described(manifest, version, sources)


def _described(manifest: IndexManifest, version: str, sources: dict[str, int]) -> dict[str, Any]:
    """The manifest without its checksums, with the directory's version and the FAQs per source."""
    data = manifest.to_dict()
    data.pop("checksums")
    return {**data, "version": version, "sources": sources}


def source_counts(records: Iterable[FaqRecord]) -> dict[str, int]:
    """FAQs per source, most first."""
    counts = Counter(record.source or "(none)" for record in records)
    return dict(counts.most_common())


# ---- the manifest and its version ------------------------------------------------------------------------------


def disk_version(directory: str | Path) -> str | None:
    """The version of the index saved at `directory` (None when there is none): cheap to poll, as it reads only
    the manifest; it changes with every save."""
    try:
        return _version_of((Path(directory).expanduser() / MANIFEST).read_bytes())
    except OSError:
        return None


def _version_of(manifest_bytes: bytes) -> str:
    """``GENERATION-HASH``: the save counter and a hash of the manifest (which holds every file's checksum)."""
    try:
        generation = int(json.loads(manifest_bytes).get("generation", 0))
    except (ValueError, AttributeError, TypeError):
        generation = 0
    return f"{generation}-{hashlib.sha256(manifest_bytes).hexdigest()[:16]}"


def _manifest_generation(target: Path) -> int:
    """The save counter of the index at `target` (0 when there is none)."""
    try:
        return int(json.loads((target / MANIFEST).read_bytes()).get("generation", 0))
    except (OSError, ValueError, AttributeError, TypeError):
        return 0


def is_index(directory: str | Path) -> bool:
    """Whether `directory` holds a built index (its manifest)."""
    return (Path(directory) / MANIFEST).is_file()


def check_index_target(directory: str | Path) -> Path:
    """The resolved `directory` if an index may be written there (new, empty, or an index); else a one-line error."""
    target = Path(directory).expanduser().resolve()
    if target.exists() and (not target.is_dir() or (not is_index(target) and any(target.iterdir()))):
        raise MedfaqError(f"{target} exists and is not a medfaq index; choose an empty or new directory")
    return target


def read_manifest(path: Path) -> IndexManifest:
    """The manifest of the index at `path`; a missing or unreadable one is a one-line error."""
    return _read_manifest_versioned(path)[0]


def _read_manifest_versioned(path: Path) -> tuple[IndexManifest, str]:
    """The manifest of the index at `path` and the version of the bytes it was read from."""
    if not path.is_dir():
        raise MedfaqError(f"index directory not found: {path}")
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise MedfaqError(f"{path} is not a medfaq index (no {MANIFEST}); build one with `medfaq index build`")
    try:
        raw = manifest_path.read_bytes()
        manifest = IndexManifest.from_dict(json.loads(raw.decode("utf-8")))
    except OSError as error:
        raise MedfaqError(f"cannot read {manifest_path}: {error.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, AttributeError) as error:
        raise IndexCorrupt(f"index {path} has a corrupt {MANIFEST} ({error}); rebuild it") from None
    if not isinstance(manifest.dimension, int) or manifest.dimension < 1:
        raise IndexCorrupt(f"index {path} has a corrupt {MANIFEST} (dimension {manifest.dimension!r}); rebuild it")
    if manifest.format_version > FORMAT_VERSION:
        raise MedfaqError(
            f"index {path} has format {manifest.format_version}; this medfaq reads up to {FORMAT_VERSION}"
        )
    return manifest, _version_of(raw)


# ---- checksums ---------------------------------------------------------------------------------------------------


def verify_checksums(path: Path, manifest: IndexManifest) -> None:
    """Check every file against its checksum in the manifest; a file verified before and unchanged since (see
    index/verified.py) is not hashed again."""
    known, checked = verified.recall(path), {}
    for name, expected in manifest.checksums.items():
        try:
            stat = (path / name).stat()
            hashed_at = time.time_ns()
            if known.get(name) != verified.signature(stat, expected):
                actual = _sha256(path / name)
                if actual != expected:
                    raise IndexCorrupt(f"index {path} is corrupt: checksum mismatch for {name}; rebuild it")
                if not verified.settled(stat, hashed_at):
                    continue
        except FileNotFoundError:  # missing, or swapped away by a save while it was read (the load then retries)
            raise IndexCorrupt(f"index {path} is corrupt: {name} is missing; rebuild it") from None
        except OSError as error:
            raise MedfaqError(f"cannot read {path / name}: {error.strerror or error}") from None
        checked[name] = verified.signature(stat, expected)
    if checked != known:
        verified.remember(path, checked)


def _checksums(directory: Path) -> dict[str, str]:
    return {
        file.relative_to(directory).as_posix(): _sha256(file)
        for file in sorted(directory.rglob("*"))
        if file.is_file() and not (file.parent == directory and file.suffix == ".json")
    }


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _read_files(directory: Path) -> dict[str, bytes]:
    """The content of every file directly in `directory`, by name."""
    return {file.name: file.read_bytes() for file in sorted(directory.iterdir()) if file.is_file()}


def _write_files(files: dict[str, bytes], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (directory / name).write_bytes(content)


# ---- the atomic swap -------------------------------------------------------------------------------------------


def _replaced_backend(target: Path, backend: dict[str, Any]) -> dict[str, Any] | None:
    """The backend section of the index at `target` if saving `backend` there replaces it with another one."""
    try:
        previous = read_manifest(target).backend if is_index(target) else None
    except MedfaqError:
        return None
    if not previous or previous == backend or previous.get("name", "faiss") not in VECTOR_BACKENDS:
        return None
    return {"name": "faiss", **previous}


def _backup_name(target: Path) -> Path:
    return target.parent / f".{target.name}.previous"


def swap_in(staging: Path, target: Path) -> None:
    """Replace `target` by `staging` with two renames; the old version is kept aside until the new one is in (a load
    puts it back where a swap stopped between the two)."""
    backup = _backup_name(target)
    if backup.exists():
        shutil.rmtree(backup)
    if target.exists():
        os.replace(target, backup)
    os.replace(staging, target)
    shutil.rmtree(backup, ignore_errors=True)


def _restore_interrupted_swap(target: Path) -> None:
    """If a save stopped between its two renames, put the previous version back (under the write lock, so a
    save that is between its renames right now finishes first)."""
    backup = _backup_name(target)
    if target.exists() or not backup.is_dir():
        return
    with write_lock(target):
        if not target.exists() and backup.is_dir():
            logger.warning("restoring %s from an interrupted save", target)
            os.replace(backup, target)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
