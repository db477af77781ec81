"""`medfaq index adapt` started from the HTTP API or the demo: one run at a time per process, in a background thread,
its state readable while it runs (a run takes minutes; a request or a page must not wait for it)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from medfaq.common.runtime import MedfaqError, utc_timestamp


@dataclass
class AdaptationState:
    """`state`: idle (never started here), running, done or failed (`error` says why); `record`: what the run
    recorded in the index's manifest (retriever/decisions/adaptation.py), or the rows removed by an undo."""

    state: Literal["idle", "running", "done", "failed"] = "idle"
    action: str = ""
    started: str = ""
    finished: str = ""
    error: str = ""
    record: dict[str, Any] = field(default_factory=dict)


class AdaptationJob:
    """Runs one adaptation (or undo) of one index at a time; `on_done` is called after each run (e.g. to serve the
    new index version)."""

    def __init__(self, index_dir: Path, on_done: Callable[[], Any] = lambda: None) -> None:
        self.index_dir, self.on_done = Path(index_dir), on_done
        self._lock = threading.Lock()
        self._state = AdaptationState()
        self._thread: threading.Thread | None = None

    def status(self) -> dict[str, Any]:
        with self._lock:
            return asdict(self._state)

    def start(self, undo: bool = False, **settings: Any) -> dict[str, Any]:
        """Start adapting (`settings`: :class:`AdaptConfig` fields) or undoing; a run in progress is a one-line
        error (HTTP 409)."""
        from medfaq.retriever.decisions.adaptation import AdaptConfig

        config = None if undo else AdaptConfig(**settings)  # bad settings fail here, before anything starts
        with self._lock:
            if self._state.state == "running":
                raise AdaptationRunning(f"an adaptation of {self.index_dir} is running since {self._state.started}")
            self._state = AdaptationState("running", "undo" if undo else "adapt", utc_timestamp())
            self._thread = threading.Thread(target=self._run, args=(config,), name="medfaq-adapt", daemon=True)
            self._thread.start()
            return asdict(self._state)

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """The state once the current run has finished (or `timeout` seconds passed)."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.status()

    def _run(self, config: Any) -> None:
        from medfaq.retriever.decisions import adaptation

        try:
            if config is None:
                record: dict[str, Any] = {"removed": adaptation.undo(self.index_dir)}
            else:
                record = adaptation.adapt(self.index_dir, config, progress=False, log=lambda _: None)
            outcome = {"state": "done", "record": record}
        except (MedfaqError, OSError) as error:
            outcome = {"state": "failed", "error": str(error)}
        with self._lock:
            self._state = AdaptationState(**{**asdict(self._state), **outcome, "finished": utc_timestamp()})
        self.on_done()


class AdaptationRunning(MedfaqError):
    """Another adaptation of the same index is running (HTTP 409)."""
