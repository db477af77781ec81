"""Approximate-nearest-neighbour comparison on synthetic vectors: FAISS Flat vs IVF vs HNSW, and Milvus Lite.

Every index is built through medfaq's own stores (`FaissStore`, `MilvusStore`), so the numbers are those of the
code that serves searches. Per configuration: build time, resident memory added by the build, recall@k against
exact (Flat) search, and p50 latency of single-query searches. IVF `nprobe` and HNSW `efSearch` are swept on one
build each; the row marked ``chosen`` per family is the cheapest setting reaching `target_recall` (or the most
accurate when none does), which is how medfaq's defaults are picked.

The vectors are a Gaussian mixture (``clusters`` centres, unit-variance noise), L2-normalised: real sentence
embeddings are clustered by topic, and uniformly random unit vectors would make every ANN index look useless.

Run ``python -m medfaq.eval.ann_bench --n-vectors 1000000 --markdown`` (see ``--help``).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from medfaq.common.runtime import MedfaqError
from medfaq.eval.latency import measure
from medfaq.eval.script_args import positive_int
from medfaq.index.faiss_store import TRAIN_SAMPLE, FaissStore, default_nlist, gpu_count

logger = logging.getLogger("medfaq.ann_bench")

FAMILIES = ("flat", "ivf", "hnsw", "milvus")
NPROBES = (1, 4, 8, 16, 32, 64)
EF_SEARCHES = (16, 32, 64, 128, 256, 512)
ADD_CHUNK = TRAIN_SAMPLE  # vectors per add call (bounded temporary memory; IVF trains on the first)
LATENCY_QUERIES = 100  # single-query searches timed per configuration


@dataclass
class AnnResult:
    """One measured configuration."""

    index: str
    params: str
    n_vectors: int
    dim: int
    build_s: float
    memory_mb: float
    recall_at_k: float
    p50_ms: float
    chosen: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def synthetic_vectors(n: int, dim: int, seed: int, clusters: int = 1000, chunk: int = 100_000) -> np.ndarray:
    """`n` L2-normalised float32 vectors from a mixture of `clusters` Gaussians (the same centres for a seed)."""
    centres = np.random.default_rng(seed).standard_normal((clusters, dim), dtype=np.float32)
    rng = np.random.default_rng(seed + 1 + n)
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        rows = centres[rng.integers(0, clusters, stop - start)] + rng.standard_normal((stop - start, dim), np.float32)
        out[start:stop] = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return out


def rss_mb() -> float:
    """Resident memory of this process in MiB (Milvus Lite runs inside it; a Milvus server's is not counted)."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean fraction of the exact top-k keys that were found."""
    hits = [len(np.intersect1d(row_found[row_found >= 0], row_truth)) for row_found, row_truth in zip(found, truth)]
    return float(np.sum(hits) / truth.size)


def _add_in_chunks(store: Any, vectors: np.ndarray, progress: bool, label: str) -> None:
    keys = np.arange(len(vectors), dtype=np.int64)
    for start in tqdm(range(0, len(vectors), ADD_CHUNK), desc=f"building {label}", disable=not progress):
        store.add(keys[start : start + ADD_CHUNK], vectors[start : start + ADD_CHUNK])


def _built(factory: Callable[[], Any], vectors: np.ndarray, progress: bool, label: str):
    """Build a store; returns (store, build seconds, MiB of resident memory the build added)."""
    gc.collect()
    before = rss_mb()
    start = time.perf_counter()
    store = factory()
    _add_in_chunks(store, vectors, progress, label)
    seconds = time.perf_counter() - start
    return store, seconds, rss_mb() - before


def _measure(
    store: Any, label: str, params: str, n: int, build: tuple[float, float], queries: np.ndarray, truth: np.ndarray
) -> AnnResult:
    """Recall of one batch search over all queries; p50 over single-query searches of the first LATENCY_QUERIES."""
    k = truth.shape[1]
    _, found = store.search(queries, k)
    latency = measure(label, lambda query: store.search(query[None, :], k), list(queries[:LATENCY_QUERIES]))
    return AnnResult(label, params, n, queries.shape[1], build[0], build[1], recall_at_k(found, truth), latency.p50_ms)


def _sweep(
    store: FaissStore, family: str, knob: str, values: tuple[int, ...], base: str, *args: Any
) -> Iterator[AnnResult]:
    for value in values:
        store.tune(**{knob: value})
        name = "nprobe" if knob == "nprobe" else "efSearch"
        yield _measure(store, family, f"{base} {name}={value}", *args)


def ann_comparison(
    n_vectors: int = 1_000_000,
    dim: int = 384,
    n_queries: int = 200,
    clusters: int = 1000,
    seed: int = 0,
    **options: Any,
) -> list[dict[str, Any]]:
    """Build and measure each family on the same `n_vectors` synthetic vectors; one dict per configuration.

    Keys: index, params, n_vectors, dim, build_s, memory_mb, recall_at_k (vs Flat), p50_ms, chosen. `options` are
    those of :func:`compare_indexes` (k, families, nlist, nprobes, hnsw_m, ef_construction, ef_searches,
    target_recall, milvus_uri, gpu, threads, progress).
    """
    vectors = synthetic_vectors(n_vectors, dim, seed, clusters)
    queries = synthetic_vectors(n_queries, dim, seed, clusters)  # same centres, fresh noise: unseen questions
    return compare_indexes(vectors, queries, **options)


def index_vectors(directory: str | Path, n_queries: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The stored vectors of a medfaq index, split into a base and `n_queries` held-out rows used as queries."""
    from medfaq.index.faq_index import FaqIndex

    vectors = np.concatenate([rows for _, rows in FaqIndex.load(directory).store.export()])
    held_out = np.zeros(len(vectors), dtype=bool)
    held_out[np.random.default_rng(seed).choice(len(vectors), n_queries, replace=False)] = True
    return vectors[~held_out], vectors[held_out]


def compare_indexes(
    vectors: np.ndarray,
    queries: np.ndarray,
    k: int = 10,
    families: tuple[str, ...] = FAMILIES,
    nlist: int | None = None,
    nprobes: tuple[int, ...] = NPROBES,
    hnsw_m: int = 32,
    ef_construction: int = 40,
    ef_searches: tuple[int, ...] = EF_SEARCHES,
    target_recall: float = 0.95,
    milvus_uri: str | None = None,
    gpu: bool | None = None,
    threads: int | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Flat vs IVF (nprobe sweep) vs HNSW (efSearch sweep) vs Milvus on base `vectors` and `queries` (normalised).

    `gpu` (None: when faiss sees a GPU) adds GPU rows for Flat and IVF. `milvus_uri` defaults to a temporary
    Milvus Lite file. `threads` sets FAISS's OpenMP threads. Rows as :func:`ann_comparison` describes.
    """
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise MedfaqError(f"unknown index families {sorted(unknown)}; choose from {', '.join(FAMILIES)}")
    if threads:
        import faiss

        faiss.omp_set_num_threads(threads)
    n_vectors, dim = vectors.shape
    results: list[AnnResult] = []

    flat, *flat_build = _built(lambda: FaissStore(dim, "flat", use_gpu=False), vectors, progress, "flat")
    _, truth = flat.search(queries, k)
    common = (n_vectors, flat_build, queries, truth)
    results.append(_measure(flat, "flat", "exact", *common))
    use_gpu = gpu_count() > 0 if gpu is None else gpu
    if use_gpu:
        flat.use_gpu = True
        results.append(_measure(flat, "flat-gpu", "exact", *common))
    del flat
    if "ivf" in families:
        lists = nlist or default_nlist(min(n_vectors, TRAIN_SAMPLE))  # what FaissStore picks for this size
        ivf, *build = _built(lambda: FaissStore(dim, "ivf", nlist=lists, use_gpu=False), vectors, progress, "ivf")
        args = (f"nlist={lists}", n_vectors, build, queries, truth)
        probes = tuple(p for p in nprobes if p <= lists)
        results += _sweep(ivf, "ivf", "nprobe", probes, *args)
        if use_gpu:
            ivf.use_gpu = True
            results += _sweep(ivf, "ivf-gpu", "nprobe", probes, *args)
        del ivf
    if "hnsw" in families:
        hnsw, *build = _built(
            lambda: FaissStore(dim, "hnsw", hnsw_m=hnsw_m, ef_construction=ef_construction, use_gpu=False),
            vectors,
            progress,
            "hnsw",
        )
        base = f"M={hnsw_m} efConstruction={ef_construction}"
        results += _sweep(hnsw, "hnsw", "ef_search", ef_searches, base, n_vectors, build, queries, truth)
        del hnsw
    if "milvus" in families:
        results.append(_milvus_row(vectors, queries, truth, milvus_uri, progress))
    _mark_chosen(results, target_recall)
    return [result.to_dict() for result in results]


def _milvus_row(
    vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray, uri: str | None, progress: bool
) -> AnnResult:
    from medfaq.index.milvus_store import MilvusStore

    with tempfile.TemporaryDirectory(prefix="medfaq-ann-") as tmp:
        milvus_uri = uri or str(Path(tmp) / "bench.db")
        MilvusStore(vectors.shape[1], uri=milvus_uri, create=False)  # start the Lite server outside the timing

        def factory() -> MilvusStore:
            return MilvusStore(vectors.shape[1], uri=milvus_uri)

        store, *build = _built(factory, vectors, progress, "milvus")
        store.save(Path(tmp) / "vectors")  # flush: searches then run on sealed, indexed segments
        row = _measure(store, "milvus-lite" if uri is None else "milvus", "FLAT", len(vectors), build, queries, truth)
        store.client.drop_collection(store.collection)
    return row


def _mark_chosen(results: list[AnnResult], target_recall: float) -> None:
    """Per family: the cheapest setting (swept cheapest first) with recall >= target, else the most accurate."""
    for family in {result.index for result in results}:
        rows = [result for result in results if result.index == family]
        good = [result for result in rows if result.recall_at_k >= target_recall]
        (good[0] if good else max(rows, key=lambda r: r.recall_at_k)).chosen = True


def format_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of :func:`ann_comparison` rows."""
    lines = [
        "| index | params | vectors | build s | memory MiB | recall@k | p50 ms | chosen |",
        "|---|---|---:|---:|---:|---:|---:|:---:|",
    ]
    lines += [
        f"| {r['index']} | {r['params']} | {r['n_vectors']:,} | {r['build_s']:.1f} | {r['memory_mb']:.0f} "
        f"| {r['recall_at_k']:.3f} | {r['p50_ms']:.2f} | {'✓' if r['chosen'] else ''} |"
        for r in rows
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m medfaq.eval.ann_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--n-vectors", type=positive_int, default=1_000_000)
    parser.add_argument("--index", type=Path, default=None, help="measure a medfaq index's own vectors instead")
    parser.add_argument("--dim", type=positive_int, default=384)
    parser.add_argument("--queries", type=positive_int, default=200)
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated: flat,ivf,hnsw,milvus")
    parser.add_argument("--nlist", type=positive_int, default=None)
    parser.add_argument("--hnsw-m", type=positive_int, default=32)
    parser.add_argument("--ef-construction", type=positive_int, default=40)
    parser.add_argument("--milvus-uri", default=None, help="a Milvus server to measure instead of Milvus Lite")
    parser.add_argument("--threads", type=positive_int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    options = dict(
        families=tuple(args.families.split(",")),
        nlist=args.nlist,
        hnsw_m=args.hnsw_m,
        ef_construction=args.ef_construction,
        milvus_uri=args.milvus_uri,
        threads=args.threads,
    )
    try:
        if args.index:
            rows = compare_indexes(*index_vectors(args.index, args.queries), **options)
        else:
            rows = ann_comparison(args.n_vectors, args.dim, n_queries=args.queries, **options)
    except MedfaqError as error:
        parser.exit(2, f"error: {error}\n")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    print(format_table(rows))


if __name__ == "__main__":
    main()
