"""Changes of an index in memory: FAQs added (encoded) and deleted, phrasings added and removed, the concept
lexicon's synonyms encoded with the FAQs that name a concept, a new index built, its vectors moved to another
backend or encoded again by another encoder.

Nothing here writes the index directory: the changed parts are saved by index/storage.py, under the write lock
(``FaqIndex.edit`` reads, changes and saves an index there). Rows that stay are never encoded again; BM25 is rebuilt
over every row when rows are added. Large encodings are resumable (index/chunked_encoding.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from medfaq.common.runtime import MedfaqError
from medfaq.index.chunked_encoding import chunks_fingerprint, encode_chunks
from medfaq.index.collections import check_records
from medfaq.index.concepts import ConceptLexicon, combined_vectors
from medfaq.index.phrasings import Phrasing, PhrasingTable
from medfaq.index.record_table import RecordTable
from medfaq.index.records import FIELDS, FaqRecord, record_text
from medfaq.index.storage import IndexManifest, IndexParts
from medfaq.index.vector_store import backend_class

if TYPE_CHECKING:  # bm25s (scipy) and sentence-transformers (torch) are imported when an index needs them
    from medfaq.index.bm25_store import Bm25Index
    from medfaq.index.encoder import SentenceEncoder

logger = logging.getLogger("medfaq.index")


class IndexEditor:
    """Adds and deletes FAQs and phrasings of an index's parts without re-encoding the rows that stay."""

    def __init__(self, parts: IndexParts, encoder: Callable[[], SentenceEncoder]) -> None:
        """`encoder` returns the index's encoder (loaded and checked against the manifest on its first call)."""
        self.parts = parts
        self._encoder = encoder

    def add(
        self, records: list[FaqRecord], progress: bool = True, staging: Path | None = None, workers: int = 1
    ) -> int:
        """Encode and add new records (ids must be new); BM25 is rebuilt over all rows. Returns how many were added.

        Everything is computed before the index changes, so a failure part-way leaves it as it was; with `staging`
        the encoded chunks survive a failure and a repeated call encodes only the missing ones. `workers` > 1
        encodes in that many processes (one per GPU on CUDA).
        """
        self.check_new(records)
        if not records:
            return 0
        parts, manifest = self.parts, self.parts.manifest
        keys = np.arange(manifest.next_key, manifest.next_key + len(records), dtype=np.int64)
        texts = [record_text(record, manifest.fields) for record in records]
        all_records = parts.records.copy()
        all_records.add(keys.tolist(), records)
        bm25 = self._bm25_over(all_records, parts.phrasings)  # texts without a word fail before any encoding
        with self._encoding(workers) as encode:
            vectors = self._vectors(records, texts, self._chunked(encode, staging, progress))
        parts.store.add(keys, vectors)
        parts.bm25, parts.records = bm25, all_records
        manifest.next_key = int(keys[-1]) + 1
        manifest.updated = _now()
        return len(records)

    def check_new(self, records: list[FaqRecord]) -> None:
        """A one-line error when `records` cannot be added: a record that cannot be indexed, or an id already in the
        index (delete it first)."""
        check_records(records, "the new records")
        clashes = [record.id for record in records if self.parts.records.key_of(record.id) is not None]
        if clashes:
            shown = ", ".join(repr(c) for c in clashes[:5])
            more = f" and {len(clashes) - 5} more" if len(clashes) > 5 else ""
            raise MedfaqError(f"duplicate FAQ ids already in the index: {shown}{more} (delete them first)")

    def delete(self, faq_ids: list[str]) -> int:
        """Remove FAQs by id without re-encoding or rebuilding anything; unknown ids are an error naming them."""
        parts = self.parts
        unknown = [faq_id for faq_id in faq_ids if parts.records.key_of(faq_id) is None]
        if unknown:
            raise MedfaqError(f"unknown FAQ id(s): {', '.join(repr(u) for u in unknown[:5])}")
        keys = np.array(sorted({parts.records.key_of(faq_id) for faq_id in faq_ids}), dtype=np.int64)
        phrasing_keys = [phrasing.key for phrasing in parts.phrasings.of_faqs(faq_ids)]
        every_key = np.concatenate([keys, np.array(phrasing_keys, dtype=np.int64)])
        parts.store.delete(every_key)
        parts.bm25.delete(every_key)
        parts.records.delete(keys.tolist())
        parts.phrasings.remove(phrasing_keys)
        parts.manifest.updated = _now()
        return len(keys)

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
        parts = self.parts
        as_records = self._new_wordings(texts_by_faq)
        if not as_records:
            return []
        first = parts.manifest.next_key
        encode = self._chunked(self._encoder().encode, staging, progress, desc="encoding phrasings")
        vectors = self._vectors(as_records, [record.question for record in as_records], encode)
        added = [
            Phrasing(first + number, record.id, record.question, _now(), by, origin)
            for number, record in enumerate(as_records)
        ]
        phrasings = parts.phrasings.copy()
        phrasings.add(added)
        bm25 = self._bm25_over(parts.records, phrasings)
        parts.store.add(np.array([p.key for p in added], dtype=np.int64), vectors)
        parts.bm25, parts.phrasings = bm25, phrasings
        parts.manifest.next_key = first + len(added)
        parts.manifest.updated = _now()
        return added

    def _new_wordings(self, texts_by_faq: Mapping[str, list[str]]) -> list[FaqRecord]:
        """Each text not blank, nor its FAQ's question or one of its phrasings, as a record of its FAQ's id (its
        whitespace collapsed); an unknown FAQ id is a one-line error."""
        parts, wordings = self.parts, []
        for faq_id, texts in texts_by_faq.items():
            key = parts.records.key_of(faq_id)
            if key is None:
                raise MedfaqError(f"no FAQ with id {faq_id!r} in the index")
            question = parts.records.get(key).question
            known = {_folded(question), *(_folded(p.text) for p in parts.phrasings.of_faqs([faq_id]))}
            for text in (" ".join(text.split()) for text in texts):
                if text and _folded(text) not in known:
                    known.add(_folded(text))
                    wordings.append(FaqRecord(id=faq_id, question=text))
        return wordings

    def remove_phrasings(self, keys: list[int]) -> list[Phrasing]:
        """Stop searching the phrasings under `keys` (unknown keys: a one-line error, nothing removed); BM25 is
        rebuilt over the rows that stay, as if the removed ones had never been added."""
        parts = self.parts
        removed = parts.phrasings.get(keys)
        parts.store.delete(np.array(keys, dtype=np.int64))
        phrasings = parts.phrasings.copy()
        phrasings.remove(keys)
        parts.bm25, parts.phrasings = self._bm25_over(parts.records, phrasings), phrasings
        parts.manifest.updated = _now()
        return removed

    def phrasing_vectors(self, texts: list[str]) -> np.ndarray:
        """The vectors `texts` would be searched with as phrasings (nothing is added; used to time an encoding)."""
        return self._vectors([FaqRecord(id="", question=text) for text in texts], texts, self._encoder().encode)

    def moved(
        self,
        backend: str,
        backend_options: dict[str, Any] | None = None,
        kind: str | None = None,
        progress: bool = True,
    ) -> IndexParts:
        """A copy of the parts whose vectors live in another backend (e.g. FAISS -> a Milvus cluster) or kind.

        Vectors are copied as stored, never re-encoded (all at once, so an IVF index trains on all of them);
        records, keys and BM25 are shared.
        """
        from tqdm.auto import tqdm

        manifest = self.parts.manifest
        kind = kind or manifest.kind
        store = backend_class(backend)(dim=manifest.dimension, kind=kind, **(backend_options or {}))
        batches = list(tqdm(self.parts.store.export(), desc="reading vectors", unit="batch", disable=not progress))
        if batches:
            store.add(np.concatenate([keys for keys, _ in batches]), np.concatenate([rows for _, rows in batches]))
        backend_section = {"name": backend, "dim": manifest.dimension}
        moved = {**manifest.to_dict(), "kind": kind, "backend": backend_section, "updated": _now()}
        return self.parts.with_vectors(IndexManifest.from_dict(moved), store)

    def reencoded(self, encoder: SentenceEncoder, progress: bool = True) -> IndexParts:
        """A copy of the parts whose FAQs and phrasings `encoder` encodes again under the same row keys (records,
        phrasings and BM25 shared; FAISS only)."""
        parts, manifest = self.parts, self.parts.manifest
        backend = manifest.backend.get("name", "faiss")
        if backend != "faiss":
            raise MedfaqError(f"re-encoding an index kept in {backend} is not supported; migrate it to faiss first")
        phrasings = list(parts.phrasings)
        records = list(parts.records.values())
        rows = records + [FaqRecord(id=p.faq_id, question=p.text) for p in phrasings]
        texts = [record_text(r, manifest.fields) for r in records] + [p.text for p in phrasings]
        keys = np.concatenate([parts.records.keys(), np.array([p.key for p in phrasings], dtype=np.int64)])
        store = backend_class(backend)(dim=encoder.dim, kind=manifest.kind)
        identity = {**encoder_identity(encoder, backend), "updated": _now()}
        copy = parts.with_vectors(IndexManifest.from_dict({**manifest.to_dict(), **identity}), store)
        vectors = self._vectors(
            rows, texts, lambda everything: encode_chunks(encoder.encode, everything, encoder.dim, None, "", progress)
        )
        store.add(keys, vectors)
        return copy

    def _bm25_over(self, records: RecordTable, phrasings: PhrasingTable) -> Bm25Index:
        """BM25 over every record's text and every phrasing, each under its row key."""
        from medfaq.index.bm25_store import Bm25Index

        texts = [record_text(record, self.parts.manifest.fields) for record in records.values()]
        texts += [phrasing.text for phrasing in phrasings]
        keys = np.concatenate([records.keys(), np.array([p.key for p in phrasings], dtype=np.int64)])
        return Bm25Index.build(texts, keys)

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

    def _expanded(self, records: list[FaqRecord], texts: list[str]) -> list[tuple[int, str]]:
        """(row, text with its concepts' other names) for each record whose question names a concept."""
        concepts = self.parts.concepts
        if concepts is None:
            return []
        rows = enumerate(zip(records, texts, strict=True))
        expanded = ((row, text, concepts.expand(text, record.question)) for row, (record, text) in rows)
        return [(row, longer) for row, text, longer in expanded if longer != text]

    def _chunked(
        self, encode: Callable[[list[str]], np.ndarray], staging: Path | None, progress: bool, **bar: str
    ) -> Callable[[list[str]], np.ndarray]:
        """`encode` run chunk by chunk (index/chunked_encoding.py), resumable with `staging`; `bar`: the progress bar's
        `desc`."""
        manifest = self.parts.manifest

        def encoded(texts: list[str]) -> np.ndarray:
            fingerprint = chunks_fingerprint(f"{manifest.encoder}\0{manifest.fields}", texts)
            return encode_chunks(encode, texts, manifest.dimension, staging, fingerprint, progress, **bar)

        return encoded

    @contextmanager
    def _encoding(self, workers: int) -> Iterator[Callable[[list[str]], np.ndarray]]:
        """The encode function: this process, or a sentence-transformers pool of `workers` processes (PyTorch; ONNX
        Runtime spreads one encoder over the cores itself)."""
        encoder = self._encoder()
        if workers <= 1 or encoder.backend != "torch":
            yield encoder.encode
            return
        model = encoder.model
        cuda = encoder.device.startswith("cuda")
        devices = None if cuda else ["cpu"] * workers  # None: one process per visible GPU
        pool = model.start_multi_process_pool(target_devices=devices)
        logger.info("encoding with %d processes", len(pool["processes"]))
        try:
            yield lambda texts: np.ascontiguousarray(
                model.encode(
                    texts, pool=pool, batch_size=encoder.batch_size, convert_to_numpy=True, normalize_embeddings=True
                ),
                dtype=np.float32,
            )
        finally:
            model.stop_multi_process_pool(pool)


def build_parts(
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
) -> IndexParts:
    """The parts of a new index of `records`, encoded by `encoder` (:meth:`FaqIndex.build`). `backend` is a registered
    vector backend ("faiss", "milvus") created with `kind` and `backend_options`. With `concepts`, an FAQ that names a
    concept is encoded with its synonyms too (index/concepts.py). `staging` makes the encoding resumable
    (index/chunked_encoding.py); `workers` > 1 encodes in that many processes (one per GPU on CUDA). An empty
    `records` is refused: an index of 0 FAQs answers nothing."""
    from medfaq.index.bm25_store import Bm25Index

    if fields not in FIELDS:
        raise MedfaqError(f"unknown --fields {fields!r}; choose one of {', '.join(FIELDS)}")
    if not records:
        raise MedfaqError("no FAQs to index (the collection is empty or every line was skipped); nothing was written")
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
    parts = IndexParts(manifest, RecordTable(), store, Bm25Index.build([], []), concepts)
    IndexEditor(parts, lambda: encoder).add(records, progress=progress, staging=staging, workers=workers)
    return parts


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


def _folded(text: str) -> str:
    """`text` compared as a wording: case and runs of whitespace ignored."""
    return " ".join(text.split()).casefold()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
