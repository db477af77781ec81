"""Latency measurement: time a function query by query and summarise the milliseconds as p50/p95/mean."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from tqdm.auto import tqdm


@dataclass
class LatencyStats:
    stage: str
    queries: int
    p50_ms: float
    p95_ms: float
    mean_ms: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def timed_loop(
    fn: Callable[[str], Any],
    queries: list[str],
    times: list[float],
    warmup: int = 3,
    bar: tqdm | None = None,
    on_result: Callable[[Any], None] | None = None,
) -> None:
    """Call `fn` on `warmup` untimed queries, then on each query, appending its milliseconds to `times` as it goes
    (so an interrupted loop keeps what it measured); `on_result` sees each timed call's result."""
    for query in queries[:warmup]:
        fn(query)
        if bar is not None:
            bar.update()
    for query in queries:
        start = time.perf_counter()
        result = fn(query)
        times.append((time.perf_counter() - start) * 1000.0)
        if on_result is not None:
            on_result(result)
        if bar is not None:
            bar.update()


def measure(stage: str, fn: Callable[[str], Any], queries: list[str], warmup: int = 3) -> LatencyStats:
    """Time `fn` on each query, one at a time, after `warmup` untimed calls."""
    times: list[float] = []
    timed_loop(fn, queries, times, warmup)
    return percentiles(stage, times)


def format_table(stats: list[LatencyStats]) -> str:
    lines = [f"{'stage':<10} {'queries':>8} {'p50 ms':>9} {'p95 ms':>9} {'mean ms':>9}"]
    lines += [f"{s.stage:<10} {s.queries:>8} {s.p50_ms:>9.2f} {s.p95_ms:>9.2f} {s.mean_ms:>9.2f}" for s in stats]
    return "\n".join(lines)


def percentiles(stage: str, times_ms: list[float]) -> LatencyStats:
    values = np.array(times_ms, dtype=np.float64)
    return LatencyStats(stage, len(values), *np.percentile(values, [50, 95]).tolist(), float(values.mean()))
