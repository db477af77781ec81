"""Latency benchmarks: p50/p95 of the pipeline end to end and per stage, of single-query search modes, batch
throughput, peak memory, index size; optionally peers side by side (rank-bm25 vs bm25s, sentence-transformers
`util.semantic_search` vs our FAISS search) and the ANN comparison of `eval.ann_bench` on synthetic vectors.

:func:`run_bench` collects raw timings into a :class:`BenchRun` with one progress bar; Ctrl-C stops it and keeps
what was measured so far, which :func:`bench_result` turns into the report.

Add a search mode by putting a factory in `STAGES`: it receives the loaded FaqIndex and returns ``fn(query) -> Any``.
"""

from __future__ import annotations

import random
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from medfaq.eval.latency import LatencyStats, format_table, measure, percentiles, timed_loop
from medfaq.retriever.search import Retriever

if TYPE_CHECKING:
    from medfaq.index.faq_index import FaqIndex
    from medfaq.retriever.pipeline import Pipeline

    StageFactory = Callable[[FaqIndex, int], Callable[[str], Any]]


def _mode(mode: str) -> StageFactory:
    def factory(index: FaqIndex, top_k: int) -> Callable[[str], Any]:
        retriever = Retriever(index, mode)
        return lambda query: retriever.search_one(query, top_k)

    return factory


STAGES: dict[str, StageFactory] = {"dense": _mode("dense"), "bm25": _mode("bm25"), "hybrid": _mode("hybrid")}


def sample_queries(index: FaqIndex, n: int = 100, seed: int = 0) -> list[str]:
    """`n` FAQ questions of the index, lower-cased, chosen with a fixed seed (latency barely depends on wording)."""
    questions = [record.question.lower() for record in index.records()]
    return random.Random(seed).sample(questions, min(n, len(questions)))


@dataclass
class BenchRun:
    """Raw milliseconds per single search, collected so far (partial when `interrupted`)."""

    queries: int
    total_ms: list[float] = field(default_factory=list)
    stage_ms: dict[str, list[float]] = field(default_factory=dict)
    mode_ms: dict[str, list[float]] = field(default_factory=dict)
    throughput: dict[str, float] | None = None
    peers: dict[str, Any] = field(default_factory=lambda: {"bm25": None, "dense": None, "ann": None})
    interrupted: bool = False


def run_bench(
    pipeline: Pipeline,
    queries: list[str],
    batch_size: int = 32,
    peers: bool = False,
    ann_vectors: int = 0,
    progress: bool = True,
    warmup: int = 3,
) -> BenchRun:
    """Time the pipeline end to end (and each stage it reports), each search mode of `STAGES`, batch throughput;
    with `peers` rank-bm25 and `util.semantic_search` on the first 20 queries; with `ann_vectors` > 0 the ANN
    comparison on that many synthetic vectors. Ctrl-C stops the run and returns what was measured."""
    run = BenchRun(len(queries))
    index, top_k = pipeline.index, pipeline.config.top_k
    per_loop = len(queries) + min(warmup, len(queries))
    bar = tqdm(total=per_loop * (1 + len(STAGES)) + len(queries), desc="bench", unit="search", disable=not progress)

    def record_stages(response: Any) -> None:
        for name, value in response.timings_ms.items():
            if name != "total":
                run.stage_ms.setdefault(name, []).append(value)

    try:
        bar.set_description("bench pipeline")
        timed_loop(pipeline.run, queries, run.total_ms, warmup, bar, record_stages)
        for name, factory in STAGES.items():
            bar.set_description(f"bench {name}")
            timed_loop(factory(index, top_k), queries, run.mode_ms.setdefault(name, []), warmup, bar)
        bar.set_description("bench batches")
        run.throughput = batch_throughput(pipeline, queries, batch_size, bar)
        bar.close()
        if peers:
            run.peers["bm25"] = bm25_peers(index, queries[:20], top_k)
            run.peers["dense"] = dense_peers(index, queries[:20], top_k)
        if ann_vectors > 0:
            from medfaq.eval.ann_bench import ann_comparison

            run.peers["ann"] = ann_comparison(n_vectors=ann_vectors, progress=progress)
    except KeyboardInterrupt:
        run.interrupted = True
    finally:
        bar.close()
    return run


def bench_result(run: BenchRun, pipeline: Pipeline, index_dir: str | Path) -> dict[str, Any]:
    """The `medfaq bench --json` object: ``queries``, ``config``, ``end_to_end`` and ``stages.<name>`` (p50_ms,
    p95_ms, mean_ms, queries), ``modes``, ``throughput``, ``index_size_mb``, ``peers``, ``peak_memory_mb``,
    ``interrupted``; parts not measured before an interruption are None (or left out of `stages`/`modes`)."""
    return {
        "queries": run.queries,
        "config": pipeline.config.to_dict(),
        "end_to_end": percentiles("end_to_end", run.total_ms).to_dict() if run.total_ms else None,
        "stages": {name: percentiles(name, values).to_dict() for name, values in run.stage_ms.items() if values},
        "modes": [percentiles(name, values).to_dict() for name, values in run.mode_ms.items() if values],
        "throughput": run.throughput,
        "index_size_mb": directory_size_mb(index_dir),
        "peers": run.peers,
        "peak_memory_mb": peak_memory_mb(),
        "interrupted": run.interrupted,
    }


def batch_throughput(
    pipeline: Pipeline, queries: list[str], batch_size: int = 32, bar: tqdm | None = None
) -> dict[str, float]:
    """Questions per second when the pipeline gets `batch_size` questions at a time."""
    start = time.perf_counter()
    for offset in range(0, len(queries), batch_size):
        batch = queries[offset : offset + batch_size]
        pipeline.run_batch(batch)
        if bar is not None:
            bar.update(len(batch))
    seconds = time.perf_counter() - start
    return {"batch_size": batch_size, "queries": len(queries), "queries_per_s": len(queries) / seconds}


def peak_memory_mb() -> float:
    """Peak resident memory of this process so far (MB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def directory_size_mb(path: str | Path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / (1024 * 1024)


def _timed_ms(fn: Callable[[str], Any], queries: list[str]) -> float:
    """Median milliseconds of `fn` over `queries` (after one untimed call)."""
    return measure("peer", fn, queries, warmup=1).p50_ms


def bm25_peers(index: FaqIndex, queries: list[str], top_k: int = 10) -> dict[str, float]:
    """rank-bm25 (BM25Okapi, same tokens) against our bm25s index: median query time and build time."""
    from rank_bm25 import BM25Okapi

    from medfaq.index.bm25_store import tokenize
    from medfaq.index.records import record_text

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


def format_report(result: dict[str, Any]) -> str:
    """The `medfaq bench` report as text: pipeline stages, search modes, throughput, memory, size, peers."""
    stages = [LatencyStats(**values) for values in result["stages"].values()]
    if result["end_to_end"]:
        stages.append(LatencyStats(**result["end_to_end"]))
    lines = [f"pipeline stages and end to end ({result['queries']} single questions):", format_table(stages)]
    if result["modes"]:
        lines += ["", "search modes:", format_table([LatencyStats(**values) for values in result["modes"]])]
    lines.append("")
    if result["throughput"]:
        throughput = result["throughput"]
        lines.append(
            f"batch throughput: {throughput['queries_per_s']:.1f} questions/s (batches of {throughput['batch_size']})"
        )
    lines.append(f"peak memory: {result['peak_memory_mb']:.0f} MB   index size: {result['index_size_mb']:.1f} MB")
    peers = result["peers"]
    if peers["bm25"]:
        bm25 = peers["bm25"]
        lines.append(
            f"rank-bm25 vs bm25s: {bm25['rank_bm25_p50_ms']:.2f} ms vs {bm25['bm25s_p50_ms']:.2f} ms p50 "
            f"({bm25['ratio']:.1f}x)"
        )
    if peers["dense"]:
        dense = peers["dense"]
        lines.append(
            f"util.semantic_search vs FAISS: {dense['semantic_search_p50_ms']:.2f} ms vs {dense['faiss_p50_ms']:.2f} ms"
            f" p50 ({dense['ratio']:.1f}x)"
        )
    ann = [row for row in peers["ann"] or [] if row.get("chosen")]
    flat = next((row for row in ann if row["index"] == "flat"), None)
    for row in ann:
        speedup = ""
        if flat and row is not flat:
            ratio = flat["p50_ms"] / row["p50_ms"]
            speedup = f", {ratio:.1f}x faster than flat" if ratio >= 1 else f", {1 / ratio:.1f}x slower than flat"
        lines.append(
            f"ANN {row['index']} ({row['params']}, {row['n_vectors']:,} vectors): recall@10 {row['recall_at_k']:.3f}, "
            f"p50 {row['p50_ms']:.3f} ms{speedup}, build {row['build_s']:.1f} s, {row['memory_mb']:.0f} MB"
        )
    if result["interrupted"]:
        lines.append("interrupted: the figures above cover what was measured before Ctrl-C")
    return "\n".join(lines)
