"""Search feedback, "Was this helpful?", from the demo and the HTTP API, in SQLite under ``MEDFAQ_HOME`` (WAL mode, safe
with several writers): material for the experts' queue and for training."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from medfaq.common.runtime import medfaq_home

FEEDBACK_FILE = "feedback.sqlite3"
BUSY_TIMEOUT_S = 30.0
SCHEMA = """
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created TEXT NOT NULL,
    session TEXT NOT NULL,
    question TEXT NOT NULL,
    summary TEXT,
    helpful INTEGER NOT NULL CHECK (helpful IN (0, 1)),
    abstained INTEGER NOT NULL,
    hit_ids TEXT NOT NULL,
    settings TEXT NOT NULL
)
"""


def default_feedback_path() -> Path:
    return medfaq_home() / "demo" / FEEDBACK_FILE


@dataclass
class Feedback:
    """One answer to "Was this helpful?" for one search."""

    session: str
    question: str
    helpful: bool
    summary: str | None = None
    abstained: bool = False
    hit_ids: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    id: int | None = None


class FeedbackStore:
    """Append-only SQLite table; every write is its own committed transaction, so nothing is lost on restart."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_feedback_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._create()

    def _create(self) -> None:
        """Switch the file to WAL and create the table, retrying while another connection holds the lock.

        SQLite does not call its busy handler when a journal-mode change meets a lock, so concurrent first
        opens (several sessions of a fresh demo) would fail at once without this loop.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                with self._connect() as connection:
                    if connection.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                        connection.execute("PRAGMA journal_mode=WAL")
                    connection.execute(SCHEMA)
                return
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        connection = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)
        try:
            with connection:  # commits, or rolls back on error
                yield connection
        finally:
            connection.close()

    def add(self, feedback: Feedback) -> int:
        """Store `feedback`; returns its row id."""
        created = feedback.created or datetime.now(timezone.utc).isoformat(timespec="seconds")
        with self._connect() as connection:
            cursor = connection.execute(
                "INSERT INTO feedback (created, session, question, summary, helpful, abstained, hit_ids, settings)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    created,
                    feedback.session,
                    feedback.question,
                    feedback.summary,
                    int(feedback.helpful),
                    int(feedback.abstained),
                    json.dumps(feedback.hit_ids),
                    json.dumps(feedback.settings, sort_keys=True),
                ),
            )
            return int(cursor.lastrowid)

    def all(self) -> list[Feedback]:
        """Every stored answer, newest first."""
        with self._connect() as connection:
            rows = connection.execute(
                "SELECT id, created, session, question, summary, helpful, abstained, hit_ids, settings"
                " FROM feedback ORDER BY id DESC"
            ).fetchall()
        return [
            Feedback(
                id=row[0],
                created=row[1],
                session=row[2],
                question=row[3],
                summary=row[4],
                helpful=bool(row[5]),
                abstained=bool(row[6]),
                hit_ids=json.loads(row[7]),
                settings=json.loads(row[8]),
            )
            for row in rows
        ]

    def rows(self) -> list[dict[str, Any]]:
        """`all()` as plain dicts (for tables and exports)."""
        return [asdict(feedback) for feedback in self.all()]
