"""The unanswered-questions log: one JSON line per abstained question, for experts to write new FAQs from."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, is_dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from medfaq.common.runtime import MedfaqError, medfaq_home
from medfaq.index.collections import iter_jsonl

UNANSWERED_FILE = "unanswered.jsonl"
_LOCKS: dict[str, threading.Lock] = {}  # one per log file, shared by every UnansweredLog object of this process
_GUARD = threading.Lock()


def default_unanswered_path() -> Path:
    """``$MEDFAQ_HOME/unanswered.jsonl``."""
    return medfaq_home() / UNANSWERED_FILE


class UnansweredLog:
    """Appends ``{"time", "query", "summary", "entities", "best_score", "best_id", "best_question", "index"}`` lines
    (`index`: the directory of the index searched, whose experts' queue takes the question; None when unsaved).

    Safe with several threads and processes: each entry is one ``write`` of a whole line to a file opened in append
    mode, under a per-file lock within the process.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path).expanduser() if path else default_unanswered_path()
        with _GUARD:
            self._lock = _LOCKS.setdefault(str(self.path.resolve()), threading.Lock())

    def append(
        self,
        query: str,
        summary: str | None,
        entities: list[Any],
        best_score: float | None,
        best_id: str | None = None,
        best_question: str | None = None,
        index: str | None = None,
    ) -> None:
        entry = {
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "query": query,
            "summary": summary,
            "entities": [asdict(e) if is_dataclass(e) else e for e in entities],
            "best_score": best_score,
            "best_id": best_id,
            "best_question": best_question,
            "index": index,
        }
        line = json.dumps(entry, ensure_ascii=False) + "\n"
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as handle:
                    handle.write(line)
            except OSError as error:
                raise MedfaqError(f"cannot write the unanswered-questions log {self.path}: {error}") from None

    def read(self) -> list[dict[str, Any]]:
        """All entries, oldest first (an absent log is empty)."""
        if not self.path.is_file():
            return []
        return [row for _, row in iter_jsonl(self.path)]
