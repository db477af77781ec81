"""FaqIndex: FAQ records + a vector store (FAISS by default) + BM25 + a JSON manifest, saved atomically.

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
Ctrl-C during `build`/`add`/`save` leaves the previous index as it was, and readers see the old or the new index,
never a mix (a load that races a save reads again).

Every write (a save over an existing index, :meth:`FaqIndex.add_to`, :meth:`FaqIndex.delete_from`, sidecar saves
by other packages through :func:`write_lock`) holds an exclusive file lock, ``.NAME.lock`` beside the directory.
`add_to`/`delete_from` read the index from disk inside the lock, so concurrent changes are all kept; a save of an
index loaded before another write changed it is refused. :attr:`FaqIndex.version` and :func:`disk_version` tell a
long-running reader that a newer index is on disk.

A load reads what every search needs (manifest, ids, vectors) and leaves the rest for first use: a record is
parsed when a hit returns it, and BM25 (bm25s, scipy) is imported when a search or a change needs it, from the
bytes of its files read at load time.

The manifest records the encoder's dimension and fingerprint; every load with an encoder compares them with the
encoder actually loaded.

Large builds are resumable: with a `staging` directory, encoded vectors are written there chunk by chunk next to a
progress record (`progress.json`), and a build that was killed encodes only the chunks still missing when it is
run again over the same texts with the same encoder. The vector backend (FAISS in the directory, or a Milvus
collection) is named in the manifest's backend section.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from medfaq.common.runtime import IndexCorrupt, MedfaqError, resolve_model
from medfaq.index import verified
from medfaq.index.collections import check_records, read_records
from medfaq.index.concepts import CONCEPTS_FILE, ConceptLexicon, combined_vectors, read_with_concepts
from medfaq.index.phrasings import Phrasing, PhrasingTable
from medfaq.index.record_table import KEYS as KEYS  # the index's layout, named here too
from medfaq.index.record_table import RECORDS, RecordTable
from medfaq.index.records import FIELDS, FaqRecord, record_text
from medfaq.index.vector_store import VECTOR_BACKENDS, VectorStore, backend_class

if TYPE_CHECKING:  # bm25s (scipy) and sentence-transformers (torch) are imported when an index needs them
    from medfaq.index.bm25_store import Bm25Index
    from medfaq.index.encoder import SentenceEncoder

logger = logging.getLogger("medfaq.index")

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
VECTORS_DIR = "vectors"
BM25_DIR = "bm25"
ENCODE_CHUNK = 512  # texts per encode call (progress and resume granularity)
PROGRESS = "progress.json"
CHUNK_FILE = "chunk-{:07d}.npy"
LOCK_TIMEOUT_ENV = "MEDFAQ_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT = 600.0  # seconds a write waits for another write to finish
LOAD_ATTEMPTS = 3  # a load that races a save reads the new index again

ScoredIds = list[list[tuple[str, float]]]
"""Per query, (FAQ id, score) pairs best first."""


@dataclass
class IndexManifest:
    """What an index directory holds; written as manifest.json and checked on load.

    `encoder_fingerprint` identifies the encoder's weights (empty in indexes built before it was recorded);
    `encoder_backend` the runtime that encoded the FAQs (torch, onnx, onnx-int8; empty before it was recorded);
    `encoder_check` how that runtime's graph agreed with its source (index/onnx/check.py; empty for torch); `generation`
    counts the saves of this directory; `sources` counts FAQs per source (for `index info`); `concepts` describes the
    concept lexicon FAQs are encoded with (empty: none); `adaptation` records what `medfaq index adapt` added and the
    development numbers it decided by (retriever/decisions/adaptation.py; empty: none). """

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


class FaqIndex:
    """FAQ records searchable by dense vectors and BM25; add and delete without re-encoding existing rows."""

    def __init__(
        self,
        manifest: IndexManifest,
        records: RecordTable,
        store: VectorStore,
        bm25: Bm25Index | dict[str, bytes],
        encoder: SentenceEncoder | None = None,
        concepts: ConceptLexicon | bytes | None = None,
        phrasings: PhrasingTable | None = None,
    ) -> None:
        """`bm25`: the index, or its saved files (name -> bytes), loaded on first use; `concepts`: the lexicon, or
        its saved bytes, parsed on first use (a search that does not rerank never needs it)."""
        self.manifest = manifest
        self.store = store
        self._phrasings = phrasings or PhrasingTable()
        self._concepts = concepts
        self._bm25 = bm25
        self._encoder = encoder
        self._records = records
        self._origin: Path | None = None  # the directory this index was loaded from or last saved to
        self._version = ""  # that directory's version then

    # ---- construction -------------------------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        records: list[FaqRecord],
        encoder: SentenceEncoder,
        fields: str = "question",
        kind: str = "flat",
        backend: str = "faiss",
        backend_options: dict[str, Any] | None = None,
        progress: bool = True,
        staging: Path | None = None,
        workers: int = 1,
        concepts: ConceptLexicon | None = None,
    ) -> FaqIndex:
        """Encode `records` and index them; call :meth:`save` to write the index.

        `backend` is a registered vector backend ("faiss", "milvus") created with `kind` and `backend_options`.
        With `concepts`, an FAQ that names a concept is encoded with its synonyms too (index/concepts.py).
        `staging` makes the encoding resumable (see the module docstring); `workers` > 1 encodes in that many
        processes (one per GPU on CUDA). An empty `records` is refused: an index of 0 FAQs answers nothing.
        """
        from medfaq.index.bm25_store import Bm25Index

        if fields not in FIELDS:
            raise MedfaqError(f"unknown --fields {fields!r}; choose one of {', '.join(FIELDS)}")
        if not records:
            raise MedfaqError(
                "no FAQs to index (the collection is empty or every line was skipped); nothing was written"
            )
        check_records(records, "the collection")
        store = backend_class(backend)(dim=encoder.dim, kind=kind, **(backend_options or {}))
        now = _now()
        manifest = IndexManifest(
            **encoder_identity(encoder, backend),
            fields=fields,
            kind=kind,
            created=now,
            updated=now,
            concepts=concepts.describe() if concepts else {},
        )
        index = cls(manifest, RecordTable(), store, Bm25Index.build([], []), encoder, concepts)
        index.add(records, progress=progress, staging=staging, workers=workers)
        return index

    def moved_to(
        self,
        backend: str,
        backend_options: dict[str, Any] | None = None,
        kind: str | None = None,
        progress: bool = True,
    ) -> FaqIndex:
        """A copy of this index whose vectors live in another backend (e.g. FAISS -> a Milvus cluster) or kind.

        Vectors are copied as stored, never re-encoded (all at once, so an IVF index trains on all of them);
        records, keys and BM25 are shared. Call :meth:`save`.
        """
        from tqdm.auto import tqdm

        kind = kind or self.manifest.kind
        store = backend_class(backend)(dim=self.manifest.dimension, kind=kind, **(backend_options or {}))
        parts = list(tqdm(self.store.export(), desc="reading vectors", unit="batch", disable=not progress))
        if parts:
            store.add(np.concatenate([keys for keys, _ in parts]), np.concatenate([vectors for _, vectors in parts]))
        backend_section = {"name": backend, "dim": self.manifest.dimension}
        manifest = IndexManifest.from_dict(
            {**self.manifest.to_dict(), "kind": kind, "backend": backend_section, "updated": _now()}
        )
        moved = FaqIndex(
            manifest, self._records.copy(), store, self._bm25, self._encoder, self._concepts, self._phrasings.copy()
        )
        moved._origin, moved._version = self._origin, self._version  # saving it in place checks for other writes
        return moved

    def reencoded(self, encoder: SentenceEncoder, progress: bool = True) -> FaqIndex:
        """A copy of this index whose FAQs and phrasings `encoder` encodes again under the same row keys (records,
        phrasings and BM25 shared; FAISS only). Call :meth:`save`."""
        backend = self.manifest.backend.get("name", "faiss")
        if backend != "faiss":
            raise MedfaqError(f"re-encoding an index kept in {backend} is not supported; migrate it to faiss first")
        phrasings = list(self._phrasings)
        rows = list(self._records.values()) + [FaqRecord(id=p.faq_id, question=p.text) for p in phrasings]
        texts = [record_text(r, self.manifest.fields) for r in rows[: len(self._records)]] + [p.text for p in phrasings]
        keys = np.concatenate([self._records.keys(), np.array([p.key for p in phrasings], dtype=np.int64)])
        store = backend_class(backend)(dim=encoder.dim, kind=self.manifest.kind)
        identity = {**encoder_identity(encoder, backend), "updated": _now()}
        manifest = IndexManifest.from_dict({**self.manifest.to_dict(), **identity})
        copy = FaqIndex(
            manifest, self._records.copy(), store, self._bm25, encoder, self._concepts, self._phrasings.copy()
        )
        vectors = copy._vectors(
            rows, texts, lambda everything: encode_chunks(encoder.encode, everything, encoder.dim, None, "", progress)
        )
        store.add(keys, vectors)
        copy._origin, copy._version = self._origin, self._version  # saving it in place checks for other writes
        return copy

    @property
    def bm25(self) -> Bm25Index:
        """The BM25 index, loaded on first use (two threads that race here both load it; either result serves)."""
        bm25 = self._bm25
        if isinstance(bm25, dict):
            from medfaq.index.bm25_store import Bm25Index

            bm25 = self._bm25 = Bm25Index.from_files(bm25)
        return bm25

    def _bm25_rows(self) -> int:
        """How many rows BM25 indexes, without loading it."""
        bm25 = self._bm25
        if isinstance(bm25, dict):
            from medfaq.index.bm25_store import KEYS_FILE

            return int((np.load(io.BytesIO(bm25[KEYS_FILE]), allow_pickle=False) >= 0).sum())
        return len(bm25)

    @property
    def encoder(self) -> SentenceEncoder:
        """The encoder named in the manifest (loaded on first use, see :meth:`open_encoder`)."""
        return self.open_encoder()

    def open_encoder(self, backend: str = "auto") -> SentenceEncoder:
        """The encoder named in the manifest on `backend` (see :func:`load_manifest_encoder`), loaded and checked
        against the manifest on the first call; later calls return it whatever their `backend`."""
        if self._encoder is None:
            encoder = load_manifest_encoder(self.manifest, backend, self._origin)
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
        manifest, where = self.manifest, self._origin or "this index"
        if encoder.dim != manifest.dimension:
            raise MedfaqError(
                f"encoder {encoder.name!r} gives {encoder.dim}-d vectors but index {where} holds "
                f"{manifest.dimension}-d vectors of encoder {manifest.encoder!r}; use that encoder or rebuild the index"
            )
        if not manifest.encoder_fingerprint and not _same_encoder(encoder.name, manifest.encoder):
            raise MedfaqError(
                f"index {where} was built with encoder {manifest.encoder!r}, not {encoder.name!r}; "
                f"search it with --encoder {manifest.encoder} or rebuild it with the new encoder"
            )
        if manifest.encoder_fingerprint and encoder.fingerprint != manifest.encoder_fingerprint:
            raise MedfaqError(
                f"encoder {encoder.name!r} (fingerprint {encoder.fingerprint[:12]}) is not the model index {where} "
                f"was built with: {manifest.encoder!r} (fingerprint {manifest.encoder_fingerprint[:12]}); "
                "use that model or rebuild the index"
            )

    @property
    def version(self) -> str:
        """The version of the directory this index was loaded from or saved to ("" for an unsaved index).

        Compare it with :func:`disk_version` to notice that another process saved a newer index there.
        """
        return self._version

    @property
    def directory(self) -> Path | None:
        """The directory this index was loaded from or last saved to."""
        return self._origin

    # ---- records --------------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, faq_id: str) -> bool:
        return self._records.key_of(faq_id) is not None

    def get(self, faq_id: str) -> FaqRecord:
        key = self._records.key_of(faq_id)
        if key is None:
            raise MedfaqError(f"no FAQ with id {faq_id!r} in the index")
        return self._records.get(key)

    def records(self) -> list[FaqRecord]:
        return list(self._records.values())

    def ids_where(self, **metadata: Any) -> list[str]:
        """FAQ ids whose metadata (or source) equals every given value, e.g. ``ids_where(qtype="treatment")``."""

        def value(record: FaqRecord, name: str) -> Any:
            return record.source if name == "source" else record.metadata.get(name)

        return [r.id for r in self._records.values() if all(value(r, n) == v for n, v in metadata.items())]

    # ---- changes --------------------------------------------------------------------------------------------------

    def add(
        self, records: list[FaqRecord], progress: bool = True, staging: Path | None = None, workers: int = 1
    ) -> int:
        """Encode and add new records (ids must be new); BM25 is rebuilt over all rows. Returns how many were added.

        Everything is computed before the index changes, so a failure part-way leaves it as it was; with `staging`
        the encoded chunks survive a failure and a repeated call encodes only the missing ones.
        """
        self.check_new(records)
        if not records:
            return 0
        keys = np.arange(self.manifest.next_key, self.manifest.next_key + len(records), dtype=np.int64)
        texts = [record_text(record, self.manifest.fields) for record in records]
        all_records = self._records.copy()
        all_records.add(keys.tolist(), records)
        bm25 = self._bm25_over(all_records, self._phrasings)  # texts without a word fail before any encoding
        with self._encoding(workers) as encode:
            vectors = self._vectors(
                records,
                texts,
                lambda everything: encode_chunks(
                    encode, everything, self.manifest.dimension, staging, self._fingerprint(everything), progress
                ),
            )
        self.store.add(keys, vectors)
        self._bm25 = bm25
        self._records = all_records
        self.manifest.next_key = int(keys[-1]) + 1
        self.manifest.updated = _now()
        return len(records)

    def _bm25_over(self, records: RecordTable, phrasings: PhrasingTable) -> Bm25Index:
        """BM25 over every record's text and every phrasing, each under its row key."""
        from medfaq.index.bm25_store import Bm25Index

        texts = [record_text(record, self.manifest.fields) for record in records.values()]
        texts += [phrasing.text for phrasing in phrasings]
        keys = np.concatenate([records.keys(), np.array([p.key for p in phrasings], dtype=np.int64)])
        return Bm25Index.build(texts, keys)

    def phrasings(self, faq_ids: Iterable[str] | None = None) -> list[Phrasing]:
        """The other wordings searched as FAQs (of `faq_ids` only, when given)."""
        return list(self._phrasings) if faq_ids is None else self._phrasings.of_faqs(faq_ids)

    def add_phrasings(self, faq_id: str, texts: list[str], by: str = "", origin: str = "") -> list[Phrasing]:
        """Search each of `texts` as FAQ `faq_id` from now on (see :meth:`add_phrasings_of`)."""
        return self.add_phrasings_of({faq_id: texts}, by, origin)

    def add_phrasings_of(
        self,
        texts_by_faq: Mapping[str, list[str]],
        by: str = "",
        origin: str = "",
        progress: bool = False,
        staging: Path | None = None,
    ) -> list[Phrasing]:
        """Search each text as the FAQ it is listed under from now on: encoded as the FAQs' questions are (with the
        concept lexicon's synonyms), one vector and one BM25 row each. Blank texts, the FAQ's own question and
        wordings it already has are skipped. Returns the phrasings added. Many texts: `progress` shows a bar, and
        `staging` keeps the encoded chunks so that a repeated call after a failure encodes only the missing ones
        (as :meth:`add` does)."""
        as_records: list[FaqRecord] = []
        for faq_id, texts in texts_by_faq.items():
            record = self.get(faq_id)
            known = {_folded(record.question), *(_folded(p.text) for p in self._phrasings.of_faqs([faq_id]))}
            for text in (" ".join(text.split()) for text in texts):
                if text and _folded(text) not in known:
                    known.add(_folded(text))
                    as_records.append(FaqRecord(id=faq_id, question=text))
        if not as_records:
            return []
        first = self.manifest.next_key
        new_texts = [record.question for record in as_records]
        vectors = self._vectors(
            as_records,
            new_texts,
            lambda everything: encode_chunks(
                self.encoder.encode,
                everything,
                self.manifest.dimension,
                staging,
                self._fingerprint(everything),
                progress,
                desc="encoding phrasings",
            ),
        )
        added = [
            Phrasing(first + number, record.id, record.question, _now(), by, origin)
            for number, record in enumerate(as_records)
        ]
        phrasings = self._phrasings.copy()
        phrasings.add(added)
        bm25 = self._bm25_over(self._records, phrasings)
        self.store.add(np.array([p.key for p in added], dtype=np.int64), vectors)
        self._bm25, self._phrasings = bm25, phrasings
        self.manifest.next_key = first + len(added)
        self.manifest.updated = _now()
        return added

    def remove_phrasings(self, keys: list[int]) -> list[Phrasing]:
        """Stop searching the phrasings under `keys` (unknown keys: a one-line error, nothing removed); BM25 is
        rebuilt over the rows that stay, as if the removed ones had never been added."""
        removed = self._phrasings.get(keys)
        self.store.delete(np.array(keys, dtype=np.int64))
        phrasings = self._phrasings.copy()
        phrasings.remove(keys)
        self._bm25, self._phrasings = self._bm25_over(self._records, phrasings), phrasings
        self.manifest.updated = _now()
        return removed

    def check_new(self, records: list[FaqRecord]) -> None:
        """A one-line error when `records` cannot be added: a record that cannot be indexed, or an id already in the
        index (delete it first)."""
        check_records(records, "the new records")
        clashes = [record.id for record in records if record.id in self]
        if clashes:
            shown = ", ".join(repr(c) for c in clashes[:5])
            more = f" and {len(clashes) - 5} more" if len(clashes) > 5 else ""
            raise MedfaqError(f"duplicate FAQ ids already in the index: {shown}{more} (delete them first)")

    @property
    def concepts(self) -> ConceptLexicon | None:
        """The concept lexicon FAQs are encoded with (None: the index has none)."""
        if isinstance(self._concepts, bytes):
            try:
                self._concepts = ConceptLexicon.parse(self._concepts, self.manifest.concepts)
            except (ValueError, TypeError) as error:
                where = self._origin or "this index"
                raise IndexCorrupt(f"index {where} has a corrupt {CONCEPTS_FILE} ({error}); rebuild it") from None
        return self._concepts

    def _vectors(self, records: list[FaqRecord], texts: list[str], encode: Callable[[list[str]], Any]) -> np.ndarray:
        """One float32 vector per text, `encode` run once: the text's own, combined with the text that adds its
        concepts' other names where the record names a concept (index/concepts.py)."""
        expanded = self._expanded(records, texts)
        encoded = encode(texts + [text for _, text in expanded])
        vectors = np.array(encoded[: len(texts)], dtype=np.float32)
        if expanded:
            rows = [row for row, _ in expanded]
            vectors[rows] = combined_vectors(vectors[rows], encoded[len(texts) :])
        return vectors

    def phrasing_vectors(self, texts: list[str]) -> np.ndarray:
        """The vectors `texts` would be searched with as phrasings (nothing is added; used to time an encoding)."""
        return self._vectors([FaqRecord(id="", question=text) for text in texts], texts, self.encoder.encode)

    def _expanded(self, records: list[FaqRecord], texts: list[str]) -> list[tuple[int, str]]:
        """(row, text with its concepts' other names) for each record whose question names a concept."""
        if self.concepts is None:
            return []
        rows = enumerate(zip(records, texts, strict=True))
        expanded = ((row, text, self.concepts.expand(text, record.question)) for row, (record, text) in rows)
        return [(row, longer) for row, text, longer in expanded if longer != text]

    def text_for_reranking(self, question: str) -> str:
        """`question` as a reranker should read it: with its concepts' other names when the index has a lexicon,
        so the reranker sees the synonyms the FAQ's vector was encoded with (an :class:`ExpandedText`, which a
        correction reranker's bi-encoder scores with the index's vector, so the first stage's cosine is what it
        corrects)."""
        return read_with_concepts(self.concepts, question)

    def _fingerprint(self, texts: list[str]) -> str:
        """Identifies what a staging directory holds: encoder, fields, chunk size and every text."""
        digest = hashlib.sha256(f"{self.manifest.encoder}\0{self.manifest.fields}\0{ENCODE_CHUNK}".encode())
        for text in texts:
            digest.update(b"\0" + text.encode("utf-8", "surrogatepass"))
        return digest.hexdigest()

    @contextmanager
    def _encoding(self, workers: int) -> Iterator[Callable[[list[str]], np.ndarray]]:
        """The encode function: this process, or a sentence-transformers pool of `workers` processes (PyTorch; ONNX
        Runtime spreads one encoder over the cores itself)."""
        if workers <= 1 or self.encoder.backend != "torch":
            yield self.encoder.encode
            return
        model = self.encoder.model
        cuda = self.encoder.device.startswith("cuda")
        devices = None if cuda else ["cpu"] * workers  # None: one process per visible GPU
        pool = model.start_multi_process_pool(target_devices=devices)
        logger.info("encoding with %d processes", len(pool["processes"]))
        try:
            yield lambda texts: np.ascontiguousarray(
                model.encode(
                    texts,
                    pool=pool,
                    batch_size=self.encoder.batch_size,
                    convert_to_numpy=True,
                    normalize_embeddings=True,
                ),
                dtype=np.float32,
            )
        finally:
            model.stop_multi_process_pool(pool)

    def delete(self, faq_ids: list[str]) -> int:
        """Remove FAQs by id without re-encoding or rebuilding anything; unknown ids are an error naming them."""
        unknown = [faq_id for faq_id in faq_ids if faq_id not in self]
        if unknown:
            raise MedfaqError(f"unknown FAQ id(s): {', '.join(repr(u) for u in unknown[:5])}")
        keys = np.array(sorted({self._records.key_of(faq_id) for faq_id in faq_ids}), dtype=np.int64)
        phrasing_keys = [phrasing.key for phrasing in self._phrasings.of_faqs(faq_ids)]
        every_key = np.concatenate([keys, np.array(phrasing_keys, dtype=np.int64)])
        self.store.delete(every_key)
        self.bm25.delete(every_key)
        self._records.delete(keys.tolist())
        self._phrasings.remove(phrasing_keys)
        self.manifest.updated = _now()
        return len(keys)

    # ---- search ---------------------------------------------------------------------------------------------------

    def _allowed_keys(self, allowed_ids: list[str] | None) -> np.ndarray | None:
        if allowed_ids is None:
            return None
        keys = [self._records.key_of(faq_id) for faq_id in allowed_ids]
        keys += [phrasing.key for phrasing in self._phrasings.of_faqs(allowed_ids)]
        return np.array([key for key in keys if key is not None], dtype=np.int64)

    def _depth(self, k: int) -> int:
        """How many rows to ask a search for so that `k` distinct FAQs come back however many phrasings match: rows
        of fewer than `k` FAQs number at most k - 1 questions plus the phrasings of the k - 1 FAQs with the most
        (not every phrasing of the index, which made each search rank thousands of rows on an adapted bank)."""
        return k + self._phrasings.most_of(k - 1)

    def _to_ids(self, scores: np.ndarray, keys: np.ndarray, k: int) -> ScoredIds:
        """Each row's FAQ ids with their scores, best first: a phrasing counts as its FAQ, and an FAQ found through
        several of its rows keeps its best score; at most `k` per row."""
        id_of, faq_of = self._records.id_of, self._phrasings.faq_of
        rows: ScoredIds = []
        for row_scores, row_keys in zip(scores.tolist(), keys.tolist()):
            found: dict[str, float] = {}
            for score, key in zip(row_scores, row_keys):
                faq_id = id_of(key) if key in self._records else faq_of(key)
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

    # ---- persistence ----------------------------------------------------------------------------------------------

    def save(self, directory: str | Path, timeout: float | None = None) -> Path:
        """Write the index to `directory` atomically (temporary directory beside it, then rename), under its write
        lock (see :func:`write_lock`; `timeout` in seconds).

        Saving an index loaded from `directory` is refused when another write changed the directory since the
        load (nothing is written): load it again and repeat the change, or use :meth:`add_to`/:meth:`delete_from`.
        """
        target = check_index_target(directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        with write_lock(target, timeout):
            on_disk = disk_version(target)
            if self._origin == target and on_disk != self._version:
                raise MedfaqError(
                    f"index {target} was changed by another write after it was loaded; nothing was saved "
                    "(load it again and repeat the change)"
                )
            self._save_locked(target)
        logger.info("saved %d FAQs to %s", len(self), target)
        return target

    def _save_locked(self, target: Path) -> None:
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.saving-"))
        staging.chmod(0o777 & ~_umask())  # mkdtemp makes it private; the index gets normal permissions
        try:
            self._records.save(staging)
            self._phrasings.save(staging)
            self.store.save(staging / VECTORS_DIR)
            if isinstance(self._bm25, dict):
                _write_files(self._bm25, staging / BM25_DIR)
            else:
                self._bm25.save(staging / BM25_DIR)
            if isinstance(self._concepts, bytes):  # never parsed: written back as read
                (staging / CONCEPTS_FILE).write_bytes(self._concepts)
            elif self._concepts is not None:
                self._concepts.save(staging / CONCEPTS_FILE)
            if target.is_dir():
                for sidecar in target.glob("*.json"):
                    if sidecar.name != MANIFEST:
                        shutil.copy2(sidecar, staging / sidecar.name)
            self.manifest.backend = {**self.manifest.backend, **self.store.backend_config()}
            counts = {"records": len(self._records), "vectors": len(self.store), "bm25": self._bm25_rows()}
            counts["phrasings"] = len(self._phrasings)
            self.manifest.counts = counts
            self.manifest.sources = _source_counts(self._records.values())
            self.manifest.checksums = _checksums(staging)
            self.manifest.generation = max(self.manifest.generation, _manifest_generation(target)) + 1
            text = json.dumps(self.manifest.to_dict(), indent=2) + "\n"
            (staging / MANIFEST).write_text(text, encoding="utf-8")
            replaced = _replaced_backend(target, self.manifest.backend)
            swap_in(staging, target)
            self._origin, self._version = target, _version_of(text.encode("utf-8"))
            if replaced:
                backend_class(replaced["name"]).discard(replaced, self.manifest.backend)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

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
            cls.load(directory).check_new(records)  # bad or clashing records fail before the model loads
            encoder = load_manifest_encoder(manifest, backend, str(directory))
            encoder.fingerprint  # noqa: B018 - computed (and cached) outside the lock too
        with write_lock(directory, timeout):
            index = cls.load(directory, encoder)
            added = index.add(records, progress=progress)
            if added:
                index.save(directory)
        return index, added

    @classmethod
    def delete_from(
        cls, directory: str | Path, faq_ids: list[str], timeout: float | None = None
    ) -> tuple[FaqIndex, int]:
        """Delete FAQs by id from the index saved in `directory` and save it: (the new index, how many were
        removed). Like :meth:`add_to`, the index is read inside the write lock."""
        return cls.edit(directory, lambda index: index.delete(faq_ids), timeout=timeout)

    @classmethod
    def edit(
        cls,
        directory: str | Path,
        change: Callable[[FaqIndex], Any],
        encoder: SentenceEncoder | None = None,
        timeout: float | None = None,
    ) -> tuple[FaqIndex, Any]:
        """Apply ``change(index)`` to the index saved in `directory` and save it: (the new index, what `change`
        returned). The index is read inside the write lock, so changes saved meanwhile by other processes are kept;
        pass the `encoder` when `change` encodes (loaded before the lock)."""
        read_manifest(Path(directory).expanduser())  # no lock file beside a directory that is no index
        with write_lock(directory, timeout):
            index = cls.load(directory, encoder)
            outcome = change(index)
            index.save(directory)
        return index, outcome

    @classmethod
    def load(cls, directory: str | Path, encoder: SentenceEncoder | str | None = None, verify: bool = True) -> FaqIndex:
        """Open an index; refuses one built with another encoder than `encoder` (name or Encoder) when given.

        A load that races a save (the directory's version changes while it is read) reads the new index; after
        `LOAD_ATTEMPTS` raced reads it reads once more under the write lock, which holds saves off.
        """
        path = Path(directory).expanduser()
        _restore_interrupted_swap(path)
        for _ in range(LOAD_ATTEMPTS):
            before = disk_version(path)
            try:
                index = cls._load_once(path, encoder, verify)
            except MedfaqError:
                swapping = not path.exists() and _backup_name(path).is_dir()  # a save between its two renames
                if disk_version(path) == before and not swapping:
                    raise
                _restore_interrupted_swap(path)  # waits for that save under the write lock
                continue
            if disk_version(path) == index.version:
                return index
        with write_lock(path):
            _restore_interrupted_swap(path)
            return cls._load_once(path, encoder, verify)

    @classmethod
    def _load_once(cls, path: Path, encoder: SentenceEncoder | str | None, verify: bool) -> FaqIndex:
        manifest, version = _read_manifest_versioned(path)
        if isinstance(encoder, str) and not _same_encoder(encoder, manifest.encoder):
            raise MedfaqError(
                f"index {path} was built with encoder {manifest.encoder!r}, not {encoder!r}; "
                f"search it with --encoder {manifest.encoder} or rebuild it with the new encoder"
            )
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
        index = cls(manifest, records, store, bm25, concepts=concepts, phrasings=phrasings)
        index._origin, index._version = path.resolve(), version
        if encoder is not None and not isinstance(encoder, str):
            index.check_encoder(encoder)
            index._encoder = encoder
        return index

    def info(self) -> dict[str, Any]:
        """The manifest plus per-source counts, for `medfaq index info`."""
        data = self.manifest.to_dict()
        data.pop("checksums")
        return {**data, "version": self.version, "sources": _source_counts(self._records.values())}


def encoder_identity(encoder: SentenceEncoder, backend: str) -> dict[str, Any]:
    """The manifest fields that say which encoder, on which runtime, wrote an index's vectors into `backend`."""
    return {
        "encoder": encoder.name,
        "dimension": encoder.dim,
        "encoder_fingerprint": encoder.fingerprint,
        "encoder_backend": getattr(encoder, "backend", ""),
        "encoder_check": getattr(encoder, "check", {}),
        "backend": {"name": backend, "dim": encoder.dim},
    }


def index_info(directory: str | Path) -> dict[str, Any]:
    """What `medfaq index info` shows, read from the manifest alone (the records too for an index saved before
    the manifest counted sources); vectors and BM25 are not opened."""
    path = Path(directory).expanduser()
    _restore_interrupted_swap(path)
    manifest, version = _read_manifest_versioned(path)
    sources = manifest.sources
    if not sources and manifest.counts.get("records"):
        sources = _source_counts(read_records(path / RECORDS))
    data = manifest.to_dict()
    data.pop("checksums")
    return {**data, "version": version, "sources": sources}


def _source_counts(records: Iterable[FaqRecord]) -> dict[str, int]:
    """FAQs per source, most first."""
    counts = Counter(record.source or "(none)" for record in records)
    return dict(counts.most_common())


def lock_file(directory: str | Path) -> Path:
    """The lock file of the index at `directory`: ``.NAME.lock`` beside it (the directory itself is swapped)."""
    target = Path(directory).expanduser().resolve()
    return target.parent / f".{target.name}.lock"


_held = threading.local()


@contextmanager
def write_lock(directory: str | Path, timeout: float | None = None) -> Iterator[Path]:
    """Hold the exclusive write lock of the index at `directory` (re-entrant in a thread); yields the resolved path.

    Every change of an index directory happens under it, sidecar files such as ``pipeline.json`` included. When
    another write holds it, one line says so and the call waits up to `timeout` seconds (default
    ``$MEDFAQ_LOCK_TIMEOUT`` or 600), then fails with a one-line error, having changed nothing.
    """
    from filelock import FileLock, Timeout

    target = Path(directory).expanduser().resolve()
    held: set[Path] = _held.__dict__.setdefault("paths", set())
    if target in held:
        yield target
        return
    wait = lock_timeout() if timeout is None else timeout
    path = lock_file(target)
    if not path.parent.is_dir():
        raise MedfaqError(f"index directory not found: {target}")
    lock = FileLock(path)
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            logger.warning("waiting for the lock on %s held by another write...", target)
            lock.acquire(timeout=wait)
    except Timeout:
        raise MedfaqError(
            f"index {target} is still locked by another write after {wait:g} s; nothing was changed "
            f"(try again when it finishes, or wait longer with --lock-timeout or ${LOCK_TIMEOUT_ENV})"
        ) from None
    except OSError as error:
        raise MedfaqError(f"cannot lock index {target}: {path}: {error.strerror or error}") from None
    held.add(target)
    try:
        yield target
    finally:
        held.discard(target)
        lock.release()


def lock_timeout() -> float:
    """Seconds a write waits for the lock: ``$MEDFAQ_LOCK_TIMEOUT`` or :data:`DEFAULT_LOCK_TIMEOUT`."""
    text = os.environ.get(LOCK_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_LOCK_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise MedfaqError(f"${LOCK_TIMEOUT_ENV} must be a number of seconds >= 0, not {text!r}")
    return value


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


def staging_dir(directory: str | Path) -> Path:
    """Where a build of `directory` keeps its encoded chunks until the index is saved: ``.NAME.building`` beside it."""
    target = Path(directory).expanduser().resolve()
    return target.parent / f".{target.name}.building"


def encode_chunks(
    encode: Callable[[list[str]], np.ndarray],
    texts: list[str],
    dim: int,
    staging: Path | None,
    fingerprint: str,
    progress: bool = True,
    desc: str = "encoding FAQ texts",
) -> np.ndarray:
    """Encode `texts` in chunks of ENCODE_CHUNK; with `staging`, keep each chunk on disk and skip those already there.

    `staging/progress.json` records the `fingerprint` and how many chunks are done; each chunk file is complete
    before the record counts it, so a kill at any point loses at most the chunk being encoded.
    """
    from tqdm.auto import tqdm

    starts = range(0, len(texts), ENCODE_CHUNK)
    done = _staged_chunks(staging, fingerprint, len(texts)) if staging is not None else 0
    bar = tqdm(total=len(texts), desc=desc, unit="text", disable=not progress)
    parts = []
    with bar:
        for number, start in enumerate(starts):
            chunk = texts[start : start + ENCODE_CHUNK]
            if staging is None:
                parts.append(encode(chunk))
            else:
                if number >= done:
                    vectors = encode(chunk)
                    _atomic_write(staging / CHUNK_FILE.format(number), lambda path: np.save(path, vectors))
                    record = json.dumps({"fingerprint": fingerprint, "texts": len(texts), "chunks_done": number + 1})
                    _atomic_write(staging / PROGRESS, lambda path: path.write_text(record + "\n", encoding="utf-8"))
                parts.append(np.load(staging / CHUNK_FILE.format(number), mmap_mode="r"))
            bar.update(len(chunk))
    return np.concatenate(parts).astype(np.float32, copy=False) if parts else np.zeros((0, dim), dtype=np.float32)


def _staged_chunks(staging: Path, fingerprint: str, total: int) -> int:
    """How many chunks `staging` already holds for this fingerprint (0 for a new staging directory)."""
    staging.mkdir(parents=True, exist_ok=True)
    if not (staging / PROGRESS).is_file():
        return 0
    try:
        record = json.loads((staging / PROGRESS).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        record = {}
    if record.get("fingerprint") != fingerprint or record.get("texts") != total:
        raise MedfaqError(
            f"{staging} holds a partial build of other texts or another encoder; build without --resume to start over"
        )
    done = int(record["chunks_done"])
    if done:
        logger.warning("resuming: %d of %d chunks already encoded in %s", done, -(-total // ENCODE_CHUNK), staging)
    return done


def _atomic_write(path: Path, write: Callable[[Path], Any]) -> None:
    """Write `path` through a temporary file and a rename, so it is either complete or absent."""
    partial = path.with_name(f".{path.name}.partial{path.suffix}")
    write(partial)
    os.replace(partial, path)


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


def _same_encoder(requested: str, built_with: str) -> bool:
    if requested == built_with:
        return True
    try:
        return resolve_model(requested) == resolve_model(built_with)
    except MedfaqError:
        return False


def _checksums(directory: Path) -> dict[str, str]:
    return {
        file.relative_to(directory).as_posix(): _sha256(file)
        for file in sorted(directory.rglob("*"))
        if file.is_file() and not (file.parent == directory and file.suffix == ".json")
    }


def _read_files(directory: Path) -> dict[str, bytes]:
    """The content of every file directly in `directory`, by name."""
    return {file.name: file.read_bytes() for file in sorted(directory.iterdir()) if file.is_file()}


def _write_files(files: dict[str, bytes], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (directory / name).write_bytes(content)


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


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


def _folded(text: str) -> str:
    """`text` compared as a wording: case and runs of whitespace ignored."""
    return " ".join(text.split()).casefold()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
