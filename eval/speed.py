"""Latency benchmarks: p50/p95 of single-query search modes and pipeline stages, batch throughput, peak memory,
index size, and peers side by side (rank-bm25 vs bm25s, sentence-transformers `util.semantic_search` vs our FAISS
search, and the ANN comparison of `eval.ann_bench` when present).

Add a search mode by putting a factory in `STAGES`: it receives the loaded FaqIndex and returns ``fn(query) -> Any``.
"""

from __future__ import annotations

import importlib.util
import random
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from index.bm25_store import tokenize
from index.faq_index import FaqIndex, record_text
from retriever.pipeline import Pipeline
from retriever.search import Retriever

StageFactory = Callable[[FaqIndex, int], Callable[[str], Any]]


def _mode(mode: str) -> StageFactory:
    def factory(index: FaqIndex, top_k: int) -> Callable[[str], Any]:
        retriever = Retriever(index, mode)
        return lambda query: retriever.search_one(query, top_k)

    return factory


STAGES: dict[str, StageFactory] = {"dense": _mode("dense"), "bm25": _mode("bm25"), "hybrid": _mode("hybrid")}


@dataclass
class LatencyStats:
    stage: str
    queries: int
    p50_ms: float
    p95_ms: float
    mean_ms: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure(stage: str, fn: Callable[[str], Any], queries: list[str], warmup: int = 3) -> LatencyStats:
    """Time `fn` on each query, one at a time, after `warmup` untimed calls."""
    for query in queries[:warmup]:
        fn(query)
    times = []
    for query in queries:
        start = time.perf_counter()
        fn(query)
        times.append((time.perf_counter() - start) * 1000.0)
    values = np.array(times)
    return LatencyStats(stage, len(times), *np.percentile(values, [50, 95]).tolist(), float(values.mean()))


def sample_queries(index: FaqIndex, n: int = 100, seed: int = 0) -> list[str]:
    """`n` FAQ questions of the index, lower-cased, chosen with a fixed seed (latency barely depends on wording)."""
    questions = [record.question.lower() for record in index.records()]
    return random.Random(seed).sample(questions, min(n, len(questions)))


def benchmark(
    index: FaqIndex, queries: list[str], stages: list[str] | None = None, top_k: int = 10
) -> list[LatencyStats]:
    return [measure(name, STAGES[name](index, top_k), queries) for name in stages or list(STAGES)]


def format_table(stats: list[LatencyStats]) -> str:
    lines = [f"{'stage':<10} {'queries':>8} {'p50 ms':>9} {'p95 ms':>9} {'mean ms':>9}"]
    lines += [f"{s.stage:<10} {s.queries:>8} {s.p50_ms:>9.2f} {s.p95_ms:>9.2f} {s.mean_ms:>9.2f}" for s in stats]
    return "\n".join(lines)


def percentiles(stage: str, times_ms: list[float]) -> LatencyStats:
    values = np.array(times_ms, dtype=np.float64)
    return LatencyStats(stage, len(values), *np.percentile(values, [50, 95]).tolist(), float(values.mean()))


def pipeline_latency(pipeline: Pipeline, queries: list[str], warmup: int = 3) -> dict[str, Any]:
    """Single-query latency of the whole pipeline and of each stage it reports:
    ``{"end_to_end": {p50_ms, p95_ms, ...}, "stages": {name: {p50_ms, p95_ms, ...}}}``."""
    for query in queries[:warmup]:
        pipeline.run(query)
    total: list[float] = []
    stages: dict[str, list[float]] = {}
    for query in queries:
        start = time.perf_counter()
        response = pipeline.run(query)
        total.append((time.perf_counter() - start) * 1000.0)
        for name, value in response.timings_ms.items():
            if name != "total":
                stages.setdefault(name, []).append(value)
    return {
        "end_to_end": percentiles("end_to_end", total).to_dict(),
        "stages": {name: percentiles(name, values).to_dict() for name, values in stages.items()},
    }


def batch_throughput(pipeline: Pipeline, queries: list[str], batch_size: int = 32) -> dict[str, float]:
    """Questions per second when the pipeline gets `batch_size` questions at a time."""
    start = time.perf_counter()
    for offset in range(0, len(queries), batch_size):
        pipeline.run_batch(queries[offset : offset + batch_size])
    seconds = time.perf_counter() - start
    return {"batch_size": batch_size, "queries": len(queries), "queries_per_s": len(queries) / seconds}


def peak_memory_mb() -> float:
    """Peak resident memory of this process so far (MB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def directory_size_mb(path: str) -> float:
    from pathlib import Path

    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / (1024 * 1024)


def _timed_ms(fn: Callable[[str], Any], queries: list[str]) -> float:
    """Median milliseconds of `fn` over `queries` (after one untimed call)."""
    return measure("peer", fn, queries, warmup=1).p50_ms


def bm25_peers(index: FaqIndex, queries: list[str], top_k: int = 10) -> dict[str, float]:
    """rank-bm25 (BM25Okapi, same tokens) against our bm25s index: median query time and build time."""
    from rank_bm25 import BM25Okapi

    texts = [record_text(r, index.manifest.fields) for r in index.records()]
    start = time.perf_counter()
    okapi = BM25Okapi(tokenize(texts))
    build_s = time.perf_counter() - start

    def rank_bm25_search(query: str) -> Any:
        scores = okapi.get_scores(tokenize([query])[0])
        return np.argsort(-scores)[:top_k]

    ours = _timed_ms(lambda q: index.search_bm25([q], top_k), queries)
    theirs = _timed_ms(rank_bm25_search, queries)
    return {"bm25s_p50_ms": ours, "rank_bm25_p50_ms": theirs, "rank_bm25_build_s": build_s, "ratio": theirs / ours}


def dense_peers(index: FaqIndex, queries: list[str], top_k: int = 10) -> dict[str, float] | None:
    """sentence-transformers `util.semantic_search` (exact, torch) against our FAISS search, both on the same
    pre-encoded query vectors; None unless the index is a FAISS Flat index (whose vectors can be read back)."""
    store = getattr(index.store, "index", None)
    if getattr(index.store, "kind", None) != "flat" or store is None:
        return None
    import faiss
    import torch
    from sentence_transformers import util

    corpus = torch.from_numpy(faiss.downcast_index(store.index).reconstruct_n(0, store.ntotal))
    vectors = index.encoder.encode(queries)
    row = {q: i for i, q in enumerate(queries)}
    ours = _timed_ms(lambda q: index.search_vectors(vectors[row[q] : row[q] + 1], top_k), queries)
    theirs = _timed_ms(
        lambda q: util.semantic_search(torch.from_numpy(vectors[row[q] : row[q] + 1]), corpus, top_k=top_k), queries
    )
    return {"faiss_p50_ms": ours, "semantic_search_p50_ms": theirs, "ratio": theirs / ours}


def ann_peers(n_vectors: int) -> list[dict] | None:
    """`eval.ann_bench.ann_comparison(n_vectors)` when that module is installed and `n_vectors` > 0."""
    if n_vectors <= 0 or importlib.util.find_spec("eval.ann_bench") is None:
        return None
    from eval.ann_bench import ann_comparison

    return ann_comparison(n_vectors=n_vectors)


def format_report(result: dict[str, Any], modes: list[LatencyStats]) -> str:
    """The `medfaq bench` report as text: search modes, pipeline stages, throughput, memory, size, peers."""
    stages = [LatencyStats(**values) for values in result["stages"].values()]
    lines = [
        f"search modes ({result['queries']} single queries):",
        format_table(modes),
        "",
        "pipeline stages and end to end:",
        format_table([*stages, LatencyStats(**result["end_to_end"])]),
        "",
        f"batch throughput: {result['throughput']['queries_per_s']:.1f} questions/s "
        f"(batches of {result['throughput']['batch_size']})",
        f"peak memory: {result['peak_memory_mb']:.0f} MB   index size: {result['index_size_mb']:.1f} MB",
    ]
    peers = result.get("peers") or {}
    if peers.get("bm25"):
        bm25 = peers["bm25"]
        lines.append(
            f"rank-bm25 vs bm25s: {bm25['rank_bm25_p50_ms']:.2f} ms vs {bm25['bm25s_p50_ms']:.2f} ms p50 "
            f"({bm25['ratio']:.1f}x)"
        )
    if peers.get("dense"):
        dense = peers["dense"]
        lines.append(
            f"util.semantic_search vs FAISS: {dense['semantic_search_p50_ms']:.2f} ms vs {dense['faiss_p50_ms']:.2f} ms"
            f" p50 ({dense['ratio']:.1f}x)"
        )
    ann = [row for row in peers.get("ann") or [] if row.get("chosen")]
    flat = next((row for row in ann if row["index"] == "flat"), None)
    for row in ann:
        speedup = f", {flat['p50_ms'] / row['p50_ms']:.0f}x faster than flat" if flat and row is not flat else ""
        lines.append(
            f"ANN {row['index']} ({row['params']}, {row['n_vectors']:,} vectors): recall@10 {row['recall_at_k']:.3f}, "
            f"p50 {row['p50_ms']:.3f} ms{speedup}, build {row['build_s']:.1f} s, {row['memory_mb']:.0f} MB"
        )
    return "\n".join(lines)
