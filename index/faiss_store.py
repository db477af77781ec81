"""The in-process FAISS vector store: inner product over normalised vectors; Flat (default), IVF or HNSW.

Keys live in the index itself (`IndexIDMap2` for Flat/HNSW, native ids for IVF), so deletes need no rebuild.
HNSW graphs cannot remove nodes, so deleted HNSW keys become tombstones that searches exclude through an
`IDSelector`; once tombstones pass `COMPACT_FRACTION` of the graph it is rebuilt from the stored vectors
(no re-encoding).

``shards > 1`` splits the vectors by key over that many sub-indexes searched in parallel threads through
`faiss.IndexShards` (one shard per GPU when GPUs are used). ``use_gpu=None`` (the default) runs unfiltered
Flat/IVF searches on GPU copies whenever faiss has GPU support and a GPU is visible; ``False`` forces the CPU,
``True`` asks for the GPU and warns when there is none. Filtered searches and HNSW stay on the CPU.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from medfaq.common.runtime import MedfaqError
from medfaq.index.vector_store import INDEX_KINDS, checked_rows

logger = logging.getLogger("medfaq.faiss")

KINDS = INDEX_KINDS
# Default nprobe / efSearch: the most accurate settings of the measured recall/latency table on MiniLM vectors of
# MedQuAD (recall@10 0.939 / 0.948 vs exact search, at 0.5 / 1.3 ms); the synthetic 1M table needs less for IVF.
# See docs/results.md, "Scale: 1M vectors" (`python -m medfaq.eval.ann_bench --index DIR`).
INDEX_FILE = "vectors.faiss"
SHARD_FILE = "vectors-{:03d}.faiss"
TOMBSTONES_FILE = "tombstones.npy"
COMPACT_FRACTION = 0.2
TRAIN_SAMPLE = 100_000  # IVF k-means runs on at most this many vectors (seeded sample)
ONE_THREAD_BELOW = 2
"""CPU searches of fewer queries than this run on one thread: on 2 cores over MedQuAD's 47,441 vectors, one query
took 3.9 ms and 4.2 ms of CPU on one thread against 7-9 ms and 15-18 ms of CPU on two; eight queries took 31 ms on
one thread against 15 on two (docs/results.md, "Start-up")."""
OPTIONS = ("kind", "nlist", "nprobe", "hnsw_m", "ef_search", "ef_construction", "use_gpu", "shards")
HALF_PRECISION_FROM = 20_000
"""A flat CPU index of at least this many vectors is searched in two passes (:class:`HalfPrecisionScan`), query by
query as FAISS's own flat search scans them: that scan is bound by memory bandwidth (over MedQuAD's 47,441 768-d
vectors, 147 MB per query), and the first pass reads half the bytes."""
FP16_MAX = 65504.0  # the largest finite fp16 value: vectors with a larger component keep the float32 search


def gpu_count() -> int:
    """GPUs faiss can use: 0 for a CPU-only faiss build or when no GPU is visible."""
    if not hasattr(faiss, "StandardGpuResources"):
        return 0
    return int(faiss.get_num_gpus())


def default_nlist(n_vectors: int) -> int:
    """IVF lists for `n_vectors`: about 4·sqrt(n), at least 39 training points per list, at most n."""
    return max(1, min(int(4 * math.sqrt(n_vectors)), n_vectors // 39 or 1, n_vectors))


class FaissStore:
    """A :class:`~index.vector_store.VectorStore` backed by FAISS."""

    def __init__(
        self,
        dim: int,
        kind: str = "flat",
        nlist: int | None = None,
        nprobe: int = 64,
        hnsw_m: int = 32,
        ef_search: int = 512,
        ef_construction: int = 40,
        use_gpu: bool | None = None,
        shards: int = 1,
    ) -> None:
        if kind not in KINDS:
            raise MedfaqError(f"unknown index kind {kind!r}; choose one of {', '.join(KINDS)}")
        if shards < 1:
            raise MedfaqError(f"--shards must be at least 1, got {shards}")
        self.dim = int(dim)
        self.kind = kind
        self.nlist = nlist
        self.nprobe = nprobe
        self.hnsw_m = hnsw_m
        self.ef_search = ef_search
        self.ef_construction = ef_construction
        self.use_gpu = use_gpu
        self.shards = int(shards)
        self.tombstones: set[int] = set()
        self.parts: list[faiss.Index] = [] if kind == "ivf" else [self._new_index() for _ in range(self.shards)]
        self._cpu_searcher: faiss.Index | None = None
        self._gpu_searcher: faiss.Index | None = None
        self._gpu_resources: list[Any] = []
        self._half: HalfPrecisionScan | None = None
        self._half_lock = threading.Lock()

    def _new_index(self, nlist: int | None = None) -> faiss.Index:
        if self.kind == "flat":
            return faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
        if self.kind == "hnsw":
            graph = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            graph.hnsw.efSearch = self.ef_search
            graph.hnsw.efConstruction = self.ef_construction
            return faiss.IndexIDMap2(graph)
        quantizer = faiss.IndexFlatIP(self.dim)
        ivf = faiss.IndexIVFFlat(quantizer, self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.nprobe = self.nprobe
        return ivf

    def backend_config(self) -> dict[str, Any]:
        """The manifest's backend section (besides the backend name)."""
        return {name: getattr(self, name) for name in OPTIONS}

    @property
    def index(self) -> faiss.Index | None:
        """The CPU index searched: the only part, or an `IndexShards` over the parts."""
        if not self.parts:
            return None
        if len(self.parts) == 1:
            return self.parts[0]
        if self._cpu_searcher is None:
            self._cpu_searcher = _shards(self.dim, self.parts)
        return self._cpu_searcher

    def _changed(self) -> None:
        self._cpu_searcher = None
        self._gpu_searcher = None
        self._half = None

    def __len__(self) -> int:
        return sum(int(part.ntotal) for part in self.parts) - len(self.tombstones)

    def tune(self, nprobe: int | None = None, ef_search: int | None = None) -> None:
        """Change the search-time accuracy/speed knobs (IVF `nprobe`, HNSW `efSearch`) of a built index."""
        self.nprobe = nprobe or self.nprobe
        self.ef_search = ef_search or self.ef_search
        for part in self.parts:
            if self.kind == "ivf":
                faiss.extract_index_ivf(part).nprobe = self.nprobe
            elif self.kind == "hnsw":
                faiss.downcast_index(part.index).hnsw.efSearch = self.ef_search
        self._changed()

    def add(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        keys, vectors = checked_rows(keys, vectors, self.dim)
        if len(keys) == 0:
            return
        if not self.parts:  # IVF: train on (a sample of) the first batch; every shard shares the trained lists
            sample = vectors
            if len(vectors) > TRAIN_SAMPLE:
                sample = vectors[np.sort(np.random.default_rng(0).choice(len(vectors), TRAIN_SAMPLE, replace=False))]
            self.nlist = min(self.nlist or default_nlist(len(sample)), len(sample))
            trained = self._new_index(self.nlist)
            logger.info("training IVF with %d lists on %d vectors", self.nlist, len(sample))
            trained.train(sample)
            self.parts = [trained] + [faiss.clone_index(trained) for _ in range(self.shards - 1)]
        self._add_routed(keys, vectors)

    def _add_routed(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Add each key to shard ``key % shards``."""
        if len(self.parts) == 1:
            self.parts[0].add_with_ids(vectors, keys)
        else:
            shard_of = keys % len(self.parts)
            for number, part in enumerate(self.parts):
                mask = shard_of == number
                if mask.any():
                    part.add_with_ids(np.ascontiguousarray(vectors[mask]), np.ascontiguousarray(keys[mask]))
        self._changed()

    def delete(self, keys: np.ndarray) -> int:
        keys = np.asarray(keys, dtype=np.int64)
        if not self.parts or len(keys) == 0:
            return 0
        if self.kind != "hnsw":
            selector = faiss.IDSelectorBatch(keys)
            removed = sum(int(part.remove_ids(selector)) for part in self.parts)
        else:
            present = set(keys[np.isin(keys, self._stored_keys())].tolist()) - self.tombstones
            self.tombstones |= present
            removed = len(present)
            if len(self.tombstones) > COMPACT_FRACTION * sum(part.ntotal for part in self.parts):
                self._compact_hnsw()
        self._changed()
        return removed

    def _stored_keys(self) -> np.ndarray:
        return np.concatenate([faiss.vector_to_array(part.id_map) for part in self.parts])

    def _compact_hnsw(self) -> None:
        """Rebuild the HNSW graphs from their own stored vectors, leaving out the tombstones."""
        keys = self._stored_keys()
        vectors = np.concatenate([part.index.reconstruct_n(0, part.ntotal) for part in self.parts])
        live = ~np.isin(keys, np.fromiter(self.tombstones, dtype=np.int64))
        logger.info("compacting HNSW: %d live of %d", int(live.sum()), len(keys))
        self.parts = [self._new_index() for _ in range(self.shards)]
        self.tombstones = set()
        if live.any():
            self._add_routed(keys[live], vectors[live])

    def search(self, queries: np.ndarray, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
        if not self.parts or len(self) + len(self.tombstones) == 0 or k <= 0:
            shape = (len(queries), max(k, 0))
            return np.full(shape, -np.inf, dtype=np.float32), np.full(shape, -1, dtype=np.int64)
        selector = self._selector(allowed)
        with _threads(1 if len(queries) < ONE_THREAD_BELOW else None):
            if selector is not None:  # IndexIDMap rewrites the shared params' selector while it searches: in turns
                searcher = self.parts[0] if len(self.parts) == 1 else _shards(self.dim, self.parts, threaded=False)
                scores, keys = searcher.search(queries, k, params=self._params(selector))
            elif (scan := self.two_pass_scan()) is not None:
                scores, keys = scan.search(queries, k)
            else:
                scores, keys = self._searcher().search(queries, k)
        scores[keys < 0] = -np.inf
        return scores, keys

    def two_pass_scan(self) -> HalfPrecisionScan | None:
        """The two-pass scan unfiltered searches of a single-part flat CPU index of at least `HALF_PRECISION_FROM`
        vectors run, made on first use and again after a change; None where FAISS's own search runs."""
        if self.kind != "flat" or len(self.parts) != 1 or self.on_gpu() or self.parts[0].ntotal < HALF_PRECISION_FROM:
            return None
        with self._half_lock:
            if self._half is None:
                self._half = HalfPrecisionScan(self.parts[0])
            return self._half if self._half.usable else None

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

    @property
    def thread_safe(self) -> bool:
        """CPU searches of FAISS indexes are safe to run at once; searches sharing GPU resources are not."""
        return not self.on_gpu()

    def on_gpu(self) -> bool:
        """Whether unfiltered searches run on GPUs: asked for (or left to auto) and possible for this kind."""
        if self.use_gpu is False or self.kind == "hnsw":
            return False
        if gpu_count() == 0:
            if self.use_gpu:
                logger.warning("FAISS GPU search requested but no GPU is usable (faiss-gpu not installed or no GPU)")
            return False
        return True

    def _searcher(self) -> faiss.Index:
        """GPU copies of the parts when :meth:`on_gpu`, else the CPU index."""
        if not self.on_gpu():
            return self.index
        if self._gpu_searcher is None:
            self._gpu_searcher = self._to_gpus()
        return self._gpu_searcher

    def _to_gpus(self) -> faiss.Index:
        """One GPU: a copy through `StandardGpuResources`; several: shard the vectors over all GPUs."""
        gpus = gpu_count()
        if len(self.parts) == 1 and gpus > 1:
            options = faiss.GpuMultipleClonerOptions()
            options.shard = True
            logger.info("sharding the FAISS index over %d GPUs", gpus)
            return faiss.index_cpu_to_all_gpus(self.parts[0], co=options)
        self._gpu_resources = [faiss.StandardGpuResources() for _ in range(min(gpus, len(self.parts)))]
        copies = [
            faiss.index_cpu_to_gpu(self._gpu_resources[number % gpus], number % gpus, part)
            for number, part in enumerate(self.parts)
        ]
        logger.info("FAISS search on %d GPU(s), %d shard(s)", len(self._gpu_resources), len(copies))
        return copies[0] if len(copies) == 1 else _shards(self.dim, copies)

    def export(self, batch: int = 100_000) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Stored keys and vectors (tombstones left out), read back from the index without re-encoding."""
        dead = np.fromiter(self.tombstones, dtype=np.int64, count=len(self.tombstones))
        for keys, vectors in self._stored_rows(batch):
            live = ~np.isin(keys, dead)
            if live.any():
                yield keys[live], vectors[live]

    def _stored_rows(self, batch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for part in self.parts:
            if self.kind != "ivf":  # IndexIDMap2: ids beside a flat or HNSW storage that reconstructs rows
                keys = faiss.vector_to_array(part.id_map)
                for start in range(0, len(keys), batch):
                    count = min(batch, len(keys) - start)
                    yield keys[start : start + count], part.index.reconstruct_n(start, count)
                continue
            lists = faiss.extract_index_ivf(part).invlists
            for number in range(lists.nlist):  # IVF-Flat codes are the raw float32 vectors
                size = lists.list_size(number)
                if size:
                    keys = faiss.rev_swig_ptr(lists.get_ids(number), size).copy()
                    codes = faiss.rev_swig_ptr(lists.get_codes(number), size * lists.code_size).copy()
                    yield keys, codes.view(np.float32).reshape(size, self.dim)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        if len(self.parts) == 1:
            faiss.write_index(self.parts[0], str(directory / INDEX_FILE))
        else:
            for number, part in enumerate(self.parts):
                faiss.write_index(part, str(directory / SHARD_FILE.format(number)))
        np.save(directory / TOMBSTONES_FILE, np.array(sorted(self.tombstones), dtype=np.int64), allow_pickle=False)

    @classmethod
    def load(cls, directory: Path, config: dict[str, Any]) -> FaissStore:
        store = cls(dim=int(config["dim"]), **{key: config[key] for key in OPTIONS if key in config})
        files = [directory / (INDEX_FILE if store.shards == 1 else SHARD_FILE.format(n)) for n in range(store.shards)]
        if all(file.is_file() for file in files):
            store.parts = [faiss.read_index(str(file)) for file in files]
            wrong = {part.d for part in store.parts} - {store.dim}
            if wrong:
                raise MedfaqError(
                    f"{directory} holds {wrong.pop()}-d vectors, not the {store.dim}-d ones its manifest names"
                )
            store.tune()
        store.tombstones = {int(key) for key in np.load(directory / TOMBSTONES_FILE, allow_pickle=False)}
        return store

    @classmethod
    def discard(cls, config: dict[str, Any], current: dict[str, Any]) -> None:
        """Nothing to drop: a FAISS index lives entirely in its directory."""


@contextmanager
def _threads(count: int | None) -> Iterator[None]:
    """FAISS's OpenMP threads in this thread set to `count` (None: as they are), restored after."""
    if count is None:
        yield
        return
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(count)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def _shards(dim: int, parts: list[faiss.Index], threaded: bool = True) -> faiss.Index:
    """An `IndexShards` searching `parts` (in parallel threads) and merging their top-k (keys kept as stored)."""
    combined = faiss.IndexShards(dim, threaded, False)
    for part in parts:
        combined.add_shard(part)
    combined.syncWithSubIndexes()
    return combined


class HalfPrecisionScan:
    """Exact inner-product search of one query over a flat index in two passes, with the float32 search's answer:
    a scan of the vectors stored in fp16 (half the bytes to read) keeps every vector whose approximate score can
    still be among the k best (:meth:`error`), which provably holds the exact top k; those are scored again in
    float32 from the index's own vectors and sorted (equal scores as the float32 search orders them)."""

    def __init__(self, part: faiss.IndexIDMap2) -> None:
        flat = faiss.downcast_index(part.index)
        self.vectors = faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d).reshape(flat.ntotal, flat.d)
        self.keys = faiss.vector_to_array(part.id_map)
        self.max_norm = float(np.linalg.norm(self.vectors, axis=1).max())
        self.usable = bool(np.abs(self.vectors).max() < FP16_MAX)
        self.coarse = faiss.IndexScalarQuantizer(flat.d, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
        if self.usable:
            self.coarse.add(self.vectors)

    def error(self, query: np.ndarray) -> float:
        """The most the fp16 pass's score of `query` with any stored vector differs from the exact one: each
        component rounds to fp16 with a relative error of at most 2^-11 (absolute 2^-25 below fp16's normal range),
        and a float32 sum of d products adds at most d x 2^-24 of their absolute sum (Cauchy-Schwarz bounds both)."""
        dim = len(query)
        bound = float(np.linalg.norm(query)) * self.max_norm
        return (2.0**-11 + dim * 2.0**-24) * bound + 2.0**-25 * float(np.abs(query).sum())

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        keys = np.full((len(queries), k), -1, dtype=np.int64)
        for i, query in enumerate(queries):
            row_scores, row_keys = self._search_one(query, min(k, len(self.keys)))
            scores[i, : len(row_scores)], keys[i, : len(row_keys)] = row_scores, row_keys
        return scores, keys

    def _search_one(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        depth = min(len(self.keys), 2 * k + 16)
        margin = 2 * self.error(query)
        while True:
            approximate, positions = self.coarse.search(query.reshape(1, -1), depth)
            floor = approximate[0, k - 1] - margin
            if approximate[0, -1] < floor or depth == len(self.keys):
                break
            depth = min(len(self.keys), 4 * depth)
        candidates = positions[0][approximate[0] >= floor]
        exact = self.vectors[candidates] @ query
        order = np.lexsort((-candidates, -exact))[:k]  # equal scores: the later-added vector first, as FAISS does
        return exact[order].astype(np.float32), self.keys[candidates[order]]
