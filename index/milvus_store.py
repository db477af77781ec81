"""The Milvus vector store: the same interface as FAISS, backed by a Milvus collection through `MilvusClient`.

`uri` is either a Milvus Lite file (a local path ending in ``.db``: the real Milvus engine embedded in the
process, used in tests and CI) or a server address (``http://host:19530``: Milvus standalone or a cluster).
The token for a secured server comes from ``$MILVUS_TOKEN`` and is never written to the manifest.

One collection per index holds an int64 primary key ``key`` and a float vector ``vector`` scored by inner product
(`IP`) on normalised vectors. Vectors live in Milvus, not in the index directory: the manifest's backend section
records the URI and the collection, so ``medfaq search --index DIR`` reopens it. A build writes a new collection
(a fresh name) and drops the one it replaces only after the new index directory is in place.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from medfaq.common.runtime import MedfaqError
from medfaq.index.vector_store import checked_rows

logger = logging.getLogger("medfaq.milvus")

KEY_FIELD = "key"
VECTOR_FIELD = "vector"
INSERT_BATCH = 10_000  # rows per insert call (keeps gRPC messages well below their 64 MB limit)
MAX_TOP_K = 16_384  # Milvus' limit on `limit`
SERVER_SCHEMES = ("http://", "https://", "tcp://", "grpc://", "unix:")
KINDS = {  # medfaq index kind -> Milvus index type, build params, search params (defaults as FaissStore's)
    "flat": ("FLAT", {}, {}),
    "ivf": ("IVF_FLAT", {"nlist": 1024}, {"nprobe": 64}),
    "hnsw": ("HNSW", {"M": 32, "efConstruction": 40}, {"ef": 512}),
}
TOKEN_ENV = "MILVUS_TOKEN"


def normalize_uri(uri: str) -> str:
    """A server address as given, or a Milvus Lite file as an absolute path (so any working directory finds it)."""
    if not uri:
        raise MedfaqError("--backend milvus needs --uri: a Milvus Lite file (e.g. faqs.db) or http://host:19530")
    if uri.startswith(SERVER_SCHEMES):
        return uri
    if not uri.endswith(".db"):
        raise MedfaqError(f"Milvus Lite file names must end in .db, got {uri!r} (or give a server as http://host:port)")
    return str(Path(uri).expanduser().resolve())


def collection_name(hint: str = "faqs") -> str:
    """A fresh valid collection name: ``medfaq_<hint>_<8 hex>`` (letters, digits and underscores only)."""
    cleaned = re.sub(r"[^0-9a-zA-Z_]", "_", hint).strip("_")[:40] or "faqs"
    return f"medfaq_{cleaned}_{uuid.uuid4().hex[:8]}"


def _connect(uri: str) -> Any:
    if not uri.startswith(SERVER_SCHEMES):  # the in-process Lite server lacks a few calls and refuses keepalive
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # pings; gRPC and pymilvus log that (harmless) unless told
        logging.getLogger("grpc._server").setLevel(logging.CRITICAL)
        logging.getLogger("pymilvus.client.iterator.query_iterator").setLevel(logging.ERROR)
    from pymilvus import MilvusClient

    try:
        return MilvusClient(uri=uri, token=os.environ.get(TOKEN_ENV, ""))
    except Exception as error:  # connection refused, unreadable Lite file, ...
        raise MedfaqError(f"cannot connect to Milvus at {uri} ({type(error).__name__}: {error})") from None


class MilvusStore:
    """A :class:`~index.vector_store.VectorStore` over one Milvus collection (inner product, normalised vectors)."""

    thread_safe = False  # its client was never checked under concurrent calls: searches take turns

    def __init__(
        self,
        dim: int,
        uri: str = "",
        collection: str | None = None,
        kind: str = "flat",
        index_params: dict[str, Any] | None = None,
        search_params: dict[str, Any] | None = None,
        create: bool = True,
        overwrite: bool = False,
    ) -> None:
        if kind not in KINDS:
            raise MedfaqError(f"unknown index kind {kind!r}; choose one of {', '.join(KINDS)}")
        self.dim = int(dim)
        self.uri = normalize_uri(uri)
        self.collection = collection or collection_name()
        self.kind = kind
        self.index_type, default_build, default_search = KINDS[kind]
        self.index_params = {**default_build, **(index_params or {})}
        self.search_params = {**default_search, **(search_params or {})}
        self.client = _connect(self.uri)
        if create:
            self._create(overwrite)

    def _create(self, overwrite: bool) -> None:
        """Create the collection; an existing one of that name is an error, or dropped first with `overwrite`."""
        from pymilvus import DataType, MilvusClient

        if self.client.has_collection(self.collection):
            if not overwrite:
                raise MedfaqError(f"Milvus collection {self.collection!r} already exists at {self.uri}; choose another")
            self.client.drop_collection(self.collection)
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field(KEY_FIELD, DataType.INT64, is_primary=True)
        schema.add_field(VECTOR_FIELD, DataType.FLOAT_VECTOR, dim=self.dim)
        index_params = self.client.prepare_index_params()
        index_params.add_index(
            field_name=VECTOR_FIELD, index_type=self.index_type, metric_type="IP", params=self.index_params
        )
        self.client.create_collection(
            self.collection, schema=schema, index_params=index_params, consistency_level="Strong"
        )
        logger.info("created Milvus collection %s at %s (%s, IP)", self.collection, self.uri, self.index_type)

    def backend_config(self) -> dict[str, Any]:
        """The manifest's backend section (besides the backend name and dimension); no credentials."""
        return {
            "uri": self.uri,
            "collection": self.collection,
            "kind": self.kind,
            "index_type": self.index_type,
            "index_params": self.index_params,
            "search_params": self.search_params,
        }

    def __len__(self) -> int:
        rows = self.client.query(self.collection, filter="", output_fields=["count(*)"])
        return int(rows[0]["count(*)"])

    def add(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Insert rows; vectors already stored under these keys (left by a change that was never saved) are replaced."""
        keys, vectors = checked_rows(keys, vectors, self.dim)
        if len(keys) == 0:
            return
        self.client.delete(self.collection, filter=_key_filter(keys))
        for start in range(0, len(keys), INSERT_BATCH):
            rows = [
                {KEY_FIELD: int(key), VECTOR_FIELD: vector}
                for key, vector in zip(keys[start : start + INSERT_BATCH], vectors[start : start + INSERT_BATCH])
            ]
            self.client.insert(self.collection, rows)

    def delete(self, keys: np.ndarray) -> int:
        keys = np.asarray(keys, dtype=np.int64)
        if len(keys) == 0:
            return 0
        before = len(self)
        self.client.delete(self.collection, filter=_key_filter(keys))
        return before - len(self)

    def search(self, queries: np.ndarray, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
        shape = (len(queries), max(k, 0))
        scores = np.full(shape, -np.inf, dtype=np.float32)
        keys = np.full(shape, -1, dtype=np.int64)
        if k <= 0 or len(queries) == 0 or (allowed is not None and len(allowed) == 0):
            return scores, keys
        results = self.client.search(
            self.collection,
            data=list(queries),
            limit=min(k, MAX_TOP_K),
            filter="" if allowed is None else _key_filter(np.asarray(allowed, dtype=np.int64)),
            output_fields=[KEY_FIELD],
            search_params={"metric_type": "IP", "params": self.search_params},
            anns_field=VECTOR_FIELD,
        )
        for row, hits in enumerate(results):
            for rank, hit in enumerate(hits):
                keys[row, rank] = int(hit[KEY_FIELD] if KEY_FIELD in hit else hit["id"])
                scores[row, rank] = float(hit["distance"])
        return scores, keys

    def export(self, batch: int = 10_000) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """All rows of the collection, page by page through a query iterator."""
        pages = self.client.query_iterator(
            self.collection, batch_size=min(batch, MAX_TOP_K), output_fields=[KEY_FIELD, VECTOR_FIELD]
        )
        try:
            while rows := pages.next():
                keys = np.fromiter((row[KEY_FIELD] for row in rows), dtype=np.int64, count=len(rows))
                yield keys, np.asarray([row[VECTOR_FIELD] for row in rows], dtype=np.float32)
        finally:
            pages.close()

    def save(self, directory: Path) -> None:
        """Vectors live in Milvus: flush them there; the directory only gets the (empty) vectors folder."""
        directory.mkdir(parents=True, exist_ok=True)
        self.client.flush(self.collection)

    @classmethod
    def load(cls, directory: Path, config: dict[str, Any]) -> MilvusStore:
        names = ("uri", "collection", "kind", "index_params", "search_params")
        store = cls(dim=int(config["dim"]), create=False, **{key: config[key] for key in names if key in config})
        if not store.client.has_collection(store.collection):
            raise MedfaqError(
                f"Milvus collection {store.collection!r} not found at {store.uri}; rebuild the index "
                f"(`medfaq index build ... --backend milvus --uri {store.uri}`)"
            )
        store.client.load_collection(store.collection)
        return store

    @classmethod
    def discard(cls, config: dict[str, Any], current: dict[str, Any]) -> None:
        """Drop the collection of an index that a newer build replaced (a missing one is fine)."""
        if (current.get("uri"), current.get("collection")) == (config.get("uri"), config.get("collection")):
            return
        try:
            client = _connect(normalize_uri(config["uri"]))
            if client.has_collection(config["collection"]):
                client.drop_collection(config["collection"])
                logger.info("dropped replaced Milvus collection %s", config["collection"])
        except MedfaqError as error:
            logger.warning("could not drop the replaced Milvus collection %s: %s", config.get("collection"), error)


def _key_filter(keys: np.ndarray) -> str:
    """A Milvus boolean expression selecting exactly `keys`: a range when they are consecutive, else a list."""
    low, high = int(keys.min()), int(keys.max())
    if high - low + 1 == len(keys) and len(np.unique(keys)) == len(keys):
        return f"{KEY_FIELD} >= {low} and {KEY_FIELD} <= {high}"
    return f"{KEY_FIELD} in [{','.join(str(int(key)) for key in keys)}]"
