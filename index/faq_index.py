"""FaqIndex: the index a search reads: FAQ records by id, dense search over a vector store (FAISS by default), BM25,
phrasings found as their FAQ, and the text a reranker reads.

Its parts and their directory are index/storage.py's (the manifest, checksums, the atomic save; the write lock is
index/lock.py's); its changes are index/editor.py's (:meth:`FaqIndex.editor`). :meth:`FaqIndex.edit` reads an
index inside the write lock, changes it and saves it, so concurrent changes are all kept; a save of an index loaded
before another write changed it is refused. :attr:`FaqIndex.version` and :func:`disk_version` tell a long-running
reader that a newer index is on disk.

The manifest records the encoder's dimension and fingerprint; every load with an encoder compares them with the
encoder actually loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from medfaq.common.runtime import MedfaqError, resolve_model
from medfaq.index.concepts import ConceptLexicon, read_with_concepts
from medfaq.index.editor import IndexEditor, build_parts
from medfaq.index.lock import write_lock
from medfaq.index.phrasings import Phrasing
from medfaq.index.records import FaqRecord
from medfaq.index.storage import IndexManifest, IndexParts, load_parts, read_manifest
from medfaq.index.vector_store import VectorStore

if TYPE_CHECKING:  # bm25s (scipy) and sentence-transformers (torch) are imported when an index needs them
    from medfaq.index.bm25_store import Bm25Index
    from medfaq.index.encoder import SentenceEncoder

ScoredIds = list[list[tuple[str, float]]]
"""Per query, (FAQ id, score) pairs best first."""


class FaqIndex:
    """FAQ records searchable by dense vectors and BM25; changed through :meth:`editor` without re-encoding
    existing rows."""

    def __init__(self, parts: IndexParts, encoder: SentenceEncoder | None = None) -> None:
        self._parts = parts
        self._encoder = encoder

    # ---- construction -------------------------------------------------------------------------------------------

    @classmethod
    def build(cls, records: list[FaqRecord], encoder: SentenceEncoder, *args: Any, **options: Any) -> FaqIndex:
        """Encode `records` and index them (the options of :func:`index.editor.build_parts`: the fields encoded, the
        vector backend and its kind, progress, a staging directory that makes the encoding resumable, workers, a
        concept lexicon); call :meth:`save` to write the index. An empty `records` is refused."""
        return cls(build_parts(records, encoder, *args, **options), encoder)

    def moved_to(
        self,
        backend: str,
        backend_options: dict[str, Any] | None = None,
        kind: str | None = None,
        progress: bool = True,
    ) -> FaqIndex:
        """A copy of this index whose vectors live in another backend or kind, copied as stored, never re-encoded
        (:meth:`IndexEditor.moved`). Call :meth:`save`."""
        return FaqIndex(self.editor().moved(backend, backend_options, kind, progress), self._encoder)

    def reencoded(self, encoder: SentenceEncoder, progress: bool = True) -> FaqIndex:
        """A copy of this index whose FAQs and phrasings `encoder` encodes again under the same row keys
        (:meth:`IndexEditor.reencoded`; FAISS only). Call :meth:`save`."""
        return FaqIndex(self.editor().reencoded(encoder, progress), encoder)

    def editor(self) -> IndexEditor:
        """The changes of this index (add, delete, phrasings), made in memory: :meth:`save` keeps them."""
        return IndexEditor(self._parts, self.open_encoder)

    # ---- its parts ----------------------------------------------------------------------------------------------

    @property
    def manifest(self) -> IndexManifest:
        return self._parts.manifest

    @property
    def store(self) -> VectorStore:
        """The vector store of the FAQs' and phrasings' rows."""
        return self._parts.store

    @property
    def bm25(self) -> Bm25Index:
        """The BM25 index, loaded on first use."""
        return self._parts.bm25

    @property
    def concepts(self) -> ConceptLexicon | None:
        """The concept lexicon FAQs are encoded with (None: the index has none)."""
        return self._parts.concepts

    @property
    def version(self) -> str:
        """The version of the directory this index was loaded from or saved to ("" for an unsaved index).

        Compare it with :func:`disk_version` to notice that another process saved a newer index there.
        """
        return self._parts.version

    @property
    def directory(self) -> Path | None:
        """The directory this index was loaded from or last saved to."""
        return self._parts.origin

    def info(self) -> dict[str, Any]:
        """The manifest plus per-source counts, for `medfaq index info`."""
        return self._parts.info()

    # ---- the encoder ----------------------------------------------------------------------------------------------

    @property
    def encoder(self) -> SentenceEncoder:
        """The encoder named in the manifest (loaded on first use, see :meth:`open_encoder`)."""
        return self.open_encoder()

    def open_encoder(self, backend: str = "auto") -> SentenceEncoder:
        """The encoder named in the manifest on `backend` (see :func:`load_manifest_encoder`), loaded and checked
        against the manifest on the first call; later calls return it whatever their `backend`."""
        if self._encoder is None:
            encoder = load_manifest_encoder(self.manifest, backend, self.directory)
            self.check_encoder(encoder)
            self._encoder = encoder
        return self._encoder

    @property
    def loaded_encoder_backend(self) -> str | None:
        """The runtime the loaded encoder runs on (e.g. ``torch-bf16``), None before the encoder is loaded."""
        return None if self._encoder is None else getattr(self._encoder, "backend", None)

    def searches_concurrently(self, dense: bool) -> bool:
        """Whether searches may run in several threads at once with no lock: the vector store allows it and, for
        `dense` searches, the encoder is loaded and allows it too (BM25 only reads its arrays)."""
        if not dense:
            return True
        return self._encoder is not None and self._encoder.thread_safe and self.store.thread_safe

    def check_encoder(self, encoder: SentenceEncoder) -> None:
        """Refuse, in one line naming both, an encoder whose dimension or fingerprint differs from the manifest's.

        Indexes built before fingerprints were recorded are checked by dimension and encoder name.
        """
        manifest, where = self.manifest, self.directory or "this index"
        if encoder.dim != manifest.dimension:
            raise MedfaqError(
                f"encoder {encoder.name!r} gives {encoder.dim}-d vectors but index {where} holds "
                f"{manifest.dimension}-d vectors of encoder {manifest.encoder!r}; use that encoder or rebuild the index"
            )
        if not manifest.encoder_fingerprint:
            _check_encoder_name(encoder.name, manifest, where)
        if manifest.encoder_fingerprint and encoder.fingerprint != manifest.encoder_fingerprint:
            raise MedfaqError(
                f"encoder {encoder.name!r} (fingerprint {encoder.fingerprint[:12]}) is not the model index {where} "
                f"was built with: {manifest.encoder!r} (fingerprint {manifest.encoder_fingerprint[:12]}); "
                "use that model or rebuild the index"
            )

    # ---- records --------------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._parts.records)

    def __contains__(self, faq_id: str) -> bool:
        return self._parts.records.key_of(faq_id) is not None

    def get(self, faq_id: str) -> FaqRecord:
        key = self._parts.records.key_of(faq_id)
        if key is None:
            raise MedfaqError(f"no FAQ with id {faq_id!r} in the index")
        return self._parts.records.get(key)

    def records(self) -> list[FaqRecord]:
        return list(self._parts.records.values())

    def ids_where(self, **metadata: Any) -> list[str]:
        """FAQ ids whose metadata (or source) equals every given value, e.g. ``ids_where(qtype="treatment")``."""

        def value(record: FaqRecord, name: str) -> Any:
            return record.source if name == "source" else record.metadata.get(name)

        return [r.id for r in self._parts.records.values() if all(value(r, n) == v for n, v in metadata.items())]

    def phrasings(self, faq_ids: Iterable[str] | None = None) -> list[Phrasing]:
        """The other wordings searched as FAQs (of `faq_ids` only, when given)."""
        phrasings = self._parts.phrasings
        return list(phrasings) if faq_ids is None else phrasings.of_faqs(faq_ids)

    def text_for_reranking(self, question: str) -> str:
        """`question` as a reranker should read it: with its concepts' other names when the index has a lexicon,
        so the reranker sees the synonyms the FAQ's vector was encoded with (an :class:`ExpandedText`, which a
        correction reranker's bi-encoder scores with the index's vector, so the first stage's cosine is what it
        corrects)."""
        return read_with_concepts(self.concepts, question)

    # ---- search ---------------------------------------------------------------------------------------------------

    def _allowed_keys(self, allowed_ids: list[str] | None) -> np.ndarray | None:
        if allowed_ids is None:
            return None
        keys = [self._parts.records.key_of(faq_id) for faq_id in allowed_ids]
        keys += [phrasing.key for phrasing in self._parts.phrasings.of_faqs(allowed_ids)]
        return np.array([key for key in keys if key is not None], dtype=np.int64)

    def _depth(self, k: int) -> int:
        """How many rows to ask a search for so that `k` distinct FAQs come back however many phrasings match: rows
        of fewer than `k` FAQs number at most k - 1 questions plus the phrasings of the k - 1 FAQs with the most
        (not every phrasing of the index, which made each search rank thousands of rows on an adapted bank)."""
        return k + self._parts.phrasings.most_of(k - 1)

    def _to_ids(self, scores: np.ndarray, keys: np.ndarray, k: int) -> ScoredIds:
        """Each row's FAQ ids with their scores, best first: a phrasing counts as its FAQ, and an FAQ found through
        several of its rows keeps its best score; at most `k` per row."""
        records = self._parts.records
        id_of, faq_of = records.id_of, self._parts.phrasings.faq_of
        rows: ScoredIds = []
        for row_scores, row_keys in zip(scores.tolist(), keys.tolist()):
            found: dict[str, float] = {}
            for score, key in zip(row_scores, row_keys):
                faq_id = id_of(key) if key in records else faq_of(key)
                if faq_id is not None and faq_id not in found:
                    found[faq_id] = float(score)
            rows.append(list(found.items())[:k])
        return rows

    def search_vectors(self, vectors: np.ndarray, k: int, allowed_ids: list[str] | None = None) -> ScoredIds:
        """Dense search with query vectors already encoded by this index's encoder."""
        scores, keys = self.store.search(vectors, self._depth(k), allowed=self._allowed_keys(allowed_ids))
        return self._to_ids(scores, keys, k)

    def search_dense(self, queries: list[str], k: int, allowed_ids: list[str] | None = None) -> ScoredIds:
        """Cosine similarity between the encoded queries and the FAQ texts, best first."""
        return self.search_vectors(self.encoder.encode(list(queries)), k, allowed_ids)

    def search_bm25(self, queries: list[str], k: int, allowed_ids: list[str] | None = None) -> ScoredIds:
        """BM25 scores (only FAQs sharing at least one non-stopword term), best first."""
        scores, keys = self.bm25.search(list(queries), self._depth(k), allowed=self._allowed_keys(allowed_ids))
        return self._to_ids(scores, keys, k)

    # ---- on disk --------------------------------------------------------------------------------------------------

    @classmethod
    def load(cls, directory: str | Path, encoder: SentenceEncoder | str | None = None, verify: bool = True) -> FaqIndex:
        """Open an index; refuses one built with another encoder than `encoder` (name or Encoder) when given.

        A load that races a save reads the new index (:func:`storage.load_parts`).
        """
        path = Path(directory).expanduser()
        if isinstance(encoder, str):
            index = cls(load_parts(path, verify, lambda manifest: _check_encoder_name(encoder, manifest, path)))
        else:
            index = cls(load_parts(path, verify))
        if encoder is not None and not isinstance(encoder, str):
            index.check_encoder(encoder)
            index._encoder = encoder
        return index

    def save(self, directory: str | Path, timeout: float | None = None) -> Path:
        """Write the index to `directory` atomically under its write lock (`timeout` in seconds); refused when
        this index was loaded from `directory` and another write changed it since (:meth:`IndexParts.save`): load
        it again and repeat the change, or use :meth:`edit`."""
        return self._parts.save(directory, timeout)

    @classmethod
    def edit(
        cls,
        directory: str | Path,
        change: Callable[[FaqIndex], Any],
        encoder: SentenceEncoder | None = None,
        timeout: float | None = None,
    ) -> tuple[FaqIndex, Any]:
        """Apply ``change(index)`` (through ``index.editor()``) to the index saved in `directory` and save it: (the
        new index, what `change` returned). The index is read inside the write lock, so changes saved meanwhile by
        other processes are kept; pass the `encoder` when `change` encodes (loaded before the lock)."""
        read_manifest(Path(directory).expanduser())  # no lock file beside a directory that is no index
        with write_lock(directory, timeout):
            index = cls.load(directory, encoder)
            outcome = change(index)
            index.save(directory)
        return index, outcome

    @classmethod
    def add_to(
        cls,
        directory: str | Path,
        records: list[FaqRecord],
        encoder: SentenceEncoder | None = None,
        progress: bool = True,
        timeout: float | None = None,
        backend: str = "auto",
    ) -> tuple[FaqIndex, int]:
        """Add `records` to the index saved in `directory` and save it: (the new index, how many were added).

        The index is read from disk inside the write lock, so changes saved meanwhile by other processes are kept;
        the encoder (`encoder`, else the manifest's on `backend`) is loaded before the lock and checked against the
        manifest.
        """
        manifest = read_manifest(Path(directory).expanduser())  # no lock file beside a directory that is no index
        if encoder is None and records:  # the model loads before the lock, so other writes wait only for the change
            cls.load(directory).editor().check_new(records)  # bad or clashing records fail before the model loads
            encoder = load_manifest_encoder(manifest, backend, str(directory))
            encoder.fingerprint  # noqa: B018 - computed (and cached) outside the lock too
        with write_lock(directory, timeout):
            index = cls.load(directory, encoder)
            added = index.editor().add(records, progress=progress)
            if added:
                index.save(directory)
        return index, added

    @classmethod
    def delete_from(
        cls, directory: str | Path, faq_ids: list[str], timeout: float | None = None
    ) -> tuple[FaqIndex, int]:
        """Delete FAQs by id from the index saved in `directory` and save it: (the new index, how many were
        removed). Like :meth:`add_to`, the index is read inside the write lock."""
        return cls.edit(directory, lambda index: index.editor().delete(faq_ids), timeout=timeout)


def load_manifest_encoder(manifest: IndexManifest, backend: str = "auto", where: str | None = None) -> SentenceEncoder:
    """Load the manifest's encoder on `backend` (:func:`index.encoder.load_encoder`); a model whose files declare
    another dimension than the index's vectors is refused before it loads (seconds saved on a one-line error)."""
    from medfaq.index.encoder import load_encoder
    from medfaq.index.model_files import declared_dimension

    declared = declared_dimension(resolve_model(manifest.encoder))
    if declared is not None and declared != manifest.dimension:
        raise MedfaqError(
            f"encoder {manifest.encoder!r} gives {declared}-d vectors but index {where or 'this index'} holds "
            f"{manifest.dimension}-d vectors; use the encoder it was built with or rebuild the index"
        )
    return load_encoder(manifest.encoder, backend)


def _check_encoder_name(requested: str, manifest: IndexManifest, where: str | Path) -> None:
    """Refuse, in one line, an encoder named otherwise than the one the index was built with (a path and a name of
    the same model agree)."""
    if not _same_encoder(requested, manifest.encoder):
        raise MedfaqError(
            f"index {where} was built with encoder {manifest.encoder!r}, not {requested!r}; "
            f"search it with --encoder {manifest.encoder} or rebuild it with the new encoder"
        )


def _same_encoder(requested: str, built_with: str) -> bool:
    if requested == built_with:
        return True
    try:
        return resolve_model(requested) == resolve_model(built_with)
    except MedfaqError:
        return False
