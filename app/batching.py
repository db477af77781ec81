"""Micro-batching: calls that arrive together from several threads are handed to one batch function at once.

A server answering one question per request spends most of each request in per-call overheads (one encoder run,
one FAISS search, one lock taken per stage); grouping the requests that wait at the same moment pays them once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from medfaq.common.runtime import MedfaqError

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass(frozen=True)
class BatchSettings:
    """`max_size`: most calls in one batch; `max_wait_ms`: how long the first waiting call waits for others to
    join it, when the previous batch held more than one call (a lone caller never waits; calls that arrived while
    the previous batch ran never wait longer); `parallel`: how many batches may run at the same time (each in the
    thread of its first call). The defaults were measured on `medfaq serve` (docs/results.md, "HTTP API under
    load")."""

    max_size: int = 16
    max_wait_ms: float = 2.0
    parallel: int = 1

    def __post_init__(self) -> None:
        if self.max_size < 1 or self.parallel < 1 or not 0 <= self.max_wait_ms <= 1000:
            raise MedfaqError(
                "batch size and parallel batches must be at least 1 and batch wait 0-1000 ms, got "
                f"{self.max_size}, {self.parallel} and {self.max_wait_ms}"
            )


class _Call(Generic[Item, Result]):
    __slots__ = ("arrived", "done", "item", "outcome")

    def __init__(self, item: Item) -> None:
        self.item, self.arrived = item, time.monotonic()
        self.done = False
        self.outcome: Result | BaseException | None = None


class MicroBatcher(Generic[Item, Result]):
    """Thread-safe: :meth:`submit` from any number of threads. Up to `parallel` batches run at a time; the calls
    waiting meanwhile form the next one, which its first call runs once a batch slot is free, after waiting up to
    `max_wait_ms` from its arrival for the batch to fill when calls came together before (one batch fills at a
    time). `run(items)` returns one outcome per item, in order: its result, or the exception to raise in the thread
    that submitted it; an exception `run` itself raises is raised in every call of that batch."""

    def __init__(
        self, run: Callable[[list[Item]], list[Result | BaseException]], settings: BatchSettings | None = None
    ) -> None:
        self.run, self.settings = run, settings or BatchSettings()
        self._ready = threading.Condition()
        self._waiting: list[_Call[Item, Result]] = []
        self._running = 0  # batches started and not finished, the one filling up included
        self._filling = False  # a batch is waiting for calls to join it: no other batch starts meanwhile
        self._last_size = 0

    def submit(self, item: Item) -> Result:
        call: _Call[Item, Result] = _Call(item)
        with self._ready:
            self._waiting.append(call)
            self._ready.notify_all()  # a batch filling up may be waiting for this call
            while not call.done:
                if self._filling or self._running >= self.settings.parallel or call not in self._waiting:
                    self._ready.wait()  # a batch is filling up, every batch slot is taken, or this call's batch runs
                else:
                    self._run_next()
        if isinstance(call.outcome, BaseException):
            raise call.outcome
        return call.outcome  # type: ignore[return-value]

    def _run_next(self) -> None:
        """Run the next batch in the calling thread; called, and returns, holding the condition's lock."""
        self._running += 1
        try:
            wait = self.settings.max_wait_ms / 1000 if self._last_size > 1 else 0.0
            deadline = self._waiting[0].arrived + wait
            self._filling = True
            try:
                while len(self._waiting) < self.settings.max_size and (left := deadline - time.monotonic()) > 0:
                    self._ready.wait(left)
            finally:
                self._filling = False
            batch = self._waiting[: self.settings.max_size]
            del self._waiting[: len(batch)]
            self._last_size = len(batch)
            outcomes: list[Result | BaseException] = [RuntimeError("the batch was interrupted")] * len(batch)
            self._ready.release()
            try:
                outcomes = self._outcomes([call.item for call in batch])
            finally:
                self._ready.acquire()
                for call, outcome in zip(batch, outcomes, strict=True):  # no call of the batch is left waiting
                    call.outcome, call.done = outcome, True
        finally:
            self._running -= 1
            self._ready.notify_all()

    def _outcomes(self, items: list[Item]) -> list[Result | BaseException]:
        try:
            outcomes = list(self.run(items))
            if len(outcomes) != len(items):
                raise RuntimeError(f"batch function gave {len(outcomes)} outcomes for {len(items)} items")
        except Exception as error:  # noqa: BLE001  (handed to every call of the batch)
            return [error] * len(items)
        return outcomes
