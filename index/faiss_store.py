"""The in-process FAISS vector store: inner product over normalised vectors; Flat (default), IVF or HNSW.

Keys live in the index itself (`IndexIDMap2` for Flat/HNSW, native ids for IVF), so deletes need no rebuild.
HNSW graphs cannot remove nodes, so deleted HNSW keys become tombstones that searches exclude through an
`IDSelector`; once tombstones pass `COMPACT_FRACTION` of the graph it is rebuilt from the stored vectors
(no re-encoding). With ``use_gpu`` and a visible GPU, Flat and IVF searches run on a GPU copy.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from index.runtime import MedfaqError

logger = logging.getLogger("medfaq.faiss")

KINDS = ("flat", "ivf", "hnsw")
INDEX_FILE = "vectors.faiss"
TOMBSTONES_FILE = "tombstones.npy"
COMPACT_FRACTION = 0.2


class FaissStore:
    """A :class:`~index.vector_store.VectorStore` backed by FAISS."""

    def __init__(
        self,
        dim: int,
        kind: str = "flat",
        nlist: int | None = None,
        nprobe: int = 16,
        hnsw_m: int = 32,
        ef_search: int = 128,
        use_gpu: bool = False,
    ) -> None:
        if kind not in KINDS:
            raise MedfaqError(f"unknown index kind {kind!r}; choose one of {', '.join(KINDS)}")
        self.dim = int(dim)
        self.kind = kind
        self.nlist = nlist
        self.nprobe = nprobe
        self.hnsw_m = hnsw_m
        self.ef_search = ef_search
        self.use_gpu = use_gpu
        self.tombstones: set[int] = set()
        self.index: faiss.Index | None = None if kind == "ivf" else self._new_index()
        self._gpu_index: faiss.Index | None = None

    def _new_index(self, nlist: int | None = None) -> faiss.Index:
        if self.kind == "flat":
            return faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
        if self.kind == "hnsw":
            graph = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            graph.hnsw.efSearch = self.ef_search
            return faiss.IndexIDMap2(graph)
        quantizer = faiss.IndexFlatIP(self.dim)
        ivf = faiss.IndexIVFFlat(quantizer, self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.nprobe = self.nprobe
        return ivf

    def backend_config(self) -> dict[str, Any]:
        """The manifest's backend section (besides the backend name)."""
        return {
            "kind": self.kind,
            "nlist": self.nlist,
            "nprobe": self.nprobe,
            "hnsw_m": self.hnsw_m,
            "ef_search": self.ef_search,
            "use_gpu": self.use_gpu,
        }

    def __len__(self) -> int:
        return 0 if self.index is None else int(self.index.ntotal) - len(self.tombstones)

    def add(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise MedfaqError(f"vectors of shape {vectors.shape} do not match the index dimension {self.dim}")
        if len(keys) == 0:
            return
        if self.index is None:  # IVF: train on the first batch
            self.nlist = self.nlist or max(1, min(int(4 * math.sqrt(len(vectors))), len(vectors) // 39 or 1))
            self.nlist = min(self.nlist, len(vectors))
            self.index = self._new_index(self.nlist)
            logger.info("training IVF with %d lists on %d vectors", self.nlist, len(vectors))
            self.index.train(vectors)
        self.index.add_with_ids(vectors, keys)
        self._gpu_index = None

    def delete(self, keys: np.ndarray) -> int:
        keys = np.asarray(keys, dtype=np.int64)
        if self.index is None or len(keys) == 0:
            return 0
        if self.kind != "hnsw":
            removed = int(self.index.remove_ids(faiss.IDSelectorBatch(keys)))
        else:
            present = set(keys[np.isin(keys, self._stored_keys())].tolist()) - self.tombstones
            self.tombstones |= present
            removed = len(present)
            if len(self.tombstones) > COMPACT_FRACTION * self.index.ntotal:
                self._compact_hnsw()
        self._gpu_index = None
        return removed

    def _stored_keys(self) -> np.ndarray:
        return faiss.vector_to_array(self.index.id_map)

    def _compact_hnsw(self) -> None:
        """Rebuild the HNSW graph from its own stored vectors, leaving out the tombstones."""
        keys = self._stored_keys()
        vectors = self.index.index.reconstruct_n(0, self.index.ntotal)
        live = ~np.isin(keys, np.fromiter(self.tombstones, dtype=np.int64))
        logger.info("compacting HNSW: %d live of %d", int(live.sum()), len(keys))
        self.index = self._new_index()
        self.tombstones = set()
        if live.any():
            self.index.add_with_ids(vectors[live], keys[live])

    def search(self, queries: np.ndarray, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
        if self.index is None or self.index.ntotal == 0 or k <= 0:
            shape = (len(queries), max(k, 0))
            return np.full(shape, -np.inf, dtype=np.float32), np.full(shape, -1, dtype=np.int64)
        selector = self._selector(allowed)
        if selector is None:
            scores, keys = self._searcher().search(queries, k)
        else:
            scores, keys = self.index.search(queries, k, params=self._params(selector))
        scores[keys < 0] = -np.inf
        return scores, keys

    def _selector(self, allowed: np.ndarray | None) -> faiss.IDSelector | None:
        if allowed is None and not self.tombstones:
            return None
        keys = self._stored_keys() if allowed is None else np.asarray(allowed, dtype=np.int64)
        if self.tombstones:
            keys = keys[~np.isin(keys, np.fromiter(self.tombstones, dtype=np.int64))]
        return faiss.IDSelectorBatch(np.ascontiguousarray(keys, dtype=np.int64))

    def _params(self, selector: faiss.IDSelector) -> faiss.SearchParameters:
        if self.kind == "ivf":
            return faiss.SearchParametersIVF(sel=selector, nprobe=self.nprobe)
        if self.kind == "hnsw":
            return faiss.SearchParametersHNSW(sel=selector, efSearch=self.ef_search)
        return faiss.SearchParameters(sel=selector)

    def _searcher(self) -> faiss.Index:
        """The GPU copy when asked for and possible, else the CPU index."""
        if not self.use_gpu or self.kind == "hnsw" or not hasattr(faiss, "index_cpu_to_all_gpus"):
            return self.index
        if faiss.get_num_gpus() == 0:
            return self.index
        if self._gpu_index is None:
            self._gpu_index = faiss.index_cpu_to_all_gpus(self.index)
        return self._gpu_index

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        if self.index is not None:
            faiss.write_index(self.index, str(directory / INDEX_FILE))
        np.save(directory / TOMBSTONES_FILE, np.array(sorted(self.tombstones), dtype=np.int64), allow_pickle=False)

    @classmethod
    def load(cls, directory: Path, config: dict[str, Any]) -> FaissStore:
        names = ("kind", "nlist", "nprobe", "hnsw_m", "ef_search", "use_gpu")
        options = {key: config[key] for key in names if key in config}
        store = cls(dim=int(config["dim"]), **options)
        if (directory / INDEX_FILE).is_file():
            store.index = faiss.read_index(str(directory / INDEX_FILE))
            if store.kind == "ivf":
                faiss.extract_index_ivf(store.index).nprobe = store.nprobe
            elif store.kind == "hnsw":
                faiss.downcast_index(store.index.index).hnsw.efSearch = store.ef_search
        store.tombstones = {int(key) for key in np.load(directory / TOMBSTONES_FILE, allow_pickle=False)}
        return store
