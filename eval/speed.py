"""Latency benchmarks: p50/p95 of single-query search stages, printed as a table.

Add a stage by putting a factory in `STAGES`: it receives the loaded FaqIndex and returns ``fn(query) -> Any``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from index.faq_index import FaqIndex
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
