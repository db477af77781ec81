"""The experts' queue: the questions medfaq abstained on, grouped so that the same question asked many ways reaches
an expert once, and answered once for everyone who asks it next.

A new question joins a waiting group or opens one, without regrouping the rest: the bi-encoder proposes the
nearest waiting questions (`GroupingSettings.candidates`, cosine at least `floor`), and the duplicate-question
detector (a cross-encoder) decides "same question" at its threshold; without a detector the cosine decides
(`same_cosine`). Each group gets one title from the summarizer (else its first question), made again for both groups
when an expert splits one. An expert can split and merge groups, then either links a group to an existing FAQ (its
questions become that FAQ's phrasings in the index, index/phrasings.py) or answers it with a new FAQ (added to the
index, with the group's questions as its phrasings); both are recorded (who, when, which index version) and
undoable. Undo takes back only what the group added.

A queue belongs to one index: its groups record the index directory (resolved path: a copy of an index is another
index, with a queue of its own), and a :class:`QuestionQueue` lists, changes and answers only its index's groups;
a group of another index is an :class:`UnknownGroup`. The unanswered log records the index each question was asked
of; a question logged without one (before the queue was per index) and a group opened before, with no index
recorded, belong to the first index whose queue opens the store.

Stored in SQLite (WAL) at ``$MEDFAQ_HOME/queue.sqlite3``: several processes (the server, the demo, the CLI) share
it; adding a question decides its group inside one write transaction, so two processes never open two groups for
the same question at once.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from medfaq.common.runtime import MedfaqError, NotFound, medfaq_home
from medfaq.index.encoder import SentenceEncoder
from medfaq.index.faq_index import FaqIndex
from medfaq.index.records import FaqRecord
from medfaq.retriever.pipeline import PipelineConfig, QueryRewriter, Reranker

QUEUE_FILE = "queue.sqlite3"
BUSY_TIMEOUT_S = 30.0
TITLE_CHARS = 160
STATUSES = ("waiting", "linked", "answered")
SCHEMA = """
CREATE TABLE IF NOT EXISTS groups (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    created TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'waiting',
    faq_id TEXT,
    resolved_by TEXT,
    resolved_at TEXT,
    index_version TEXT,
    undo TEXT,
    index_dir TEXT
);
CREATE TABLE IF NOT EXISTS questions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    text TEXT NOT NULL,
    asked TEXT NOT NULL,
    source TEXT NOT NULL,
    group_id INTEGER NOT NULL REFERENCES groups(id),
    vector BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS questions_by_group ON questions(group_id);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
GROUP_COLUMNS = "id, title, status, faq_id, resolved_by, resolved_at, index_version, undo, index_dir"
FIRST_INDEX = "first_index"
"""The meta key naming the index that owns what was recorded without one."""


class UnknownGroup(NotFound):
    """A group id that is not in this index's queue (none at all, or another index's)."""


def index_identity(index_dir: str | Path) -> str:
    """The index a queue belongs to: its directory's resolved path (a copy elsewhere is another index)."""
    return str(Path(index_dir).expanduser().resolve())


def default_queue_path() -> Path:
    return medfaq_home() / QUEUE_FILE


@dataclass(frozen=True)
class GroupingSettings:
    """`candidates`: the nearest waiting questions the bi-encoder proposes; `floor`: the cosine below which a
    question is not proposed; `threshold`: the detector's score from which two questions are the same (None: the
    detector's own decision boundary, the score its training put at logit 0, else 0.5); `same_cosine`: the
    decision without a detector, chosen on the development half of MQP by best F1 (`python -m
    medfaq.eval.queue_grouping`, seed 0): 0.664 for stock MiniLM, 0.644 for the fine-tuned bi-encoder of `medfaq
    setup`; 0.65 serves both."""

    candidates: int = 10
    floor: float = 0.5
    threshold: float | None = None
    same_cosine: float = 0.65

    def __post_init__(self) -> None:
        if self.candidates < 1 or not -1 <= self.floor <= 1 or not -1 <= self.same_cosine <= 1:
            raise MedfaqError("grouping needs at least 1 candidate and cosines between -1 and 1")


@dataclass
class QueuedQuestion:
    id: int
    text: str
    asked: str
    source: str
    group_id: int


@dataclass
class QuestionGroup:
    """A group of waiting (or resolved) questions: `count` of them, first and last asked, and how it was resolved."""

    id: int
    title: str
    status: str
    questions: list[QueuedQuestion] = field(default_factory=list)
    faq_id: str | None = None
    resolved_by: str | None = None
    resolved_at: str | None = None
    index_version: str | None = None

    @property
    def count(self) -> int:
        return len(self.questions)

    def to_dict(self) -> dict[str, Any]:
        asked = [question.asked for question in self.questions]
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status,
            "count": self.count,
            "first_asked": min(asked, default=None),
            "last_asked": max(asked, default=None),
            "questions": [{"id": q.id, "text": q.text, "asked": q.asked, "source": q.source} for q in self.questions],
            "faq_id": self.faq_id,
            "resolved_by": self.resolved_by,
            "resolved_at": self.resolved_at,
            "index_version": self.index_version,
        }


class QuestionQueue:
    """The queue of the index in `index_dir`, in one SQLite file shared by every index (see the module docstring).
    `encoder` embeds questions (the index's encoder, so its vectors and the index's agree); `detector` scores
    (question, waiting question) pairs; `titler` writes a group's title; `log`: the unanswered log :meth:`sync`
    reads by default."""

    def __init__(
        self,
        path: str | Path | None = None,
        encoder: SentenceEncoder | None = None,
        detector: Reranker | None = None,
        titler: QueryRewriter | None = None,
        settings: GroupingSettings | None = None,
        log: str | Path | None = None,
        *,
        index_dir: str | Path,
    ) -> None:
        self.path = Path(path).expanduser() if path is not None else default_queue_path()
        self.index_dir = index_identity(index_dir)
        self.log = Path(log).expanduser() if log is not None else None
        self.encoder, self.detector, self.titler = encoder, detector, titler
        self.settings = settings or GroupingSettings()
        self._guard = threading.Lock()
        self._waiting: tuple[str, np.ndarray, np.ndarray, list[str]] | None = None  # version, ids, vectors, groups
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(SCHEMA)
            finally:
                db.close()
        except (OSError, sqlite3.Error) as error:
            raise MedfaqError(f"cannot open the experts' queue {self.path}: {error}") from None
        with self._connection(write=True) as db:
            self._first_index = self._adopt_unowned(db)

    def _adopt_unowned(self, db: sqlite3.Connection) -> str:
        """The store's first index, this one when there is none yet: it takes the groups recorded without an index
        (a store of before the queue was per index gets the column) and their unanswered log's position."""
        if "index_dir" not in {row[1] for row in db.execute("PRAGMA table_info(groups)")}:
            db.execute("ALTER TABLE groups ADD COLUMN index_dir TEXT")
        row = db.execute("SELECT value FROM meta WHERE key = ?", (FIRST_INDEX,)).fetchone()
        if row:
            return row[0]
        db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (FIRST_INDEX, self.index_dir))
        db.execute("UPDATE groups SET index_dir = ? WHERE index_dir IS NULL", (self.index_dir,))
        db.execute("UPDATE meta SET key = ? WHERE key = 'log'", (self._log_key,))
        return self.index_dir

    @property
    def _log_key(self) -> str:
        """The meta key of this index's position in the unanswered log."""
        return f"log {self.index_dir}"

    # ---- storage --------------------------------------------------------------------------------------------------

    @contextmanager
    def _connection(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection in one transaction (``BEGIN IMMEDIATE`` for writes: taken before anything is read)."""
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.Error as error:
            raise MedfaqError(f"the experts' queue {self.path}: {error}") from None
        finally:
            db.close()

    @staticmethod
    def _version(db: sqlite3.Connection) -> str:
        row = db.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
        return row[0] if row else "0"

    @staticmethod
    def _changed(db: sqlite3.Connection) -> str:
        version = str(int(QuestionQueue._version(db)) + 1)
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('version', ?)", (version,))
        return version

    def _waiting_questions(self, db: sqlite3.Connection) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(question ids, their unit vectors, their group ids as strings) of the waiting groups, read again only
        when the queue changed since the last read."""
        version = self._version(db)
        if self._waiting is None or self._waiting[0] != version:
            rows = db.execute(
                "SELECT q.id, q.vector, q.group_id FROM questions q JOIN groups g ON g.id = q.group_id "
                "WHERE g.status = 'waiting' AND g.index_dir = ? ORDER BY q.id",
                (self.index_dir,),
            ).fetchall()
            ids = np.array([row[0] for row in rows], dtype=np.int64)
            vectors = np.array([np.frombuffer(row[1], dtype=np.float32) for row in rows], dtype=np.float32)
            self._waiting = (version, ids, vectors, [str(row[2]) for row in rows])
        return self._waiting[1], self._waiting[2], self._waiting[3]

    # ---- grouping -------------------------------------------------------------------------------------------------

    def add(self, text: str, source: str = "abstained", asked: str | None = None) -> QueuedQuestion:
        """Queue `text`: it joins the waiting group of the same question, or opens a new group."""
        text = " ".join(text.split())
        if not text:
            raise MedfaqError("an empty question cannot be queued")
        if self.encoder is None:
            raise MedfaqError("the experts' queue needs the index's encoder to group questions")
        vector = np.asarray(self.encoder.encode([text])[0], dtype=np.float32)
        asked = asked or _now()
        with self._guard, self._connection(write=True) as db:
            ids, vectors, groups = self._waiting_questions(db)
            group_id = self._same_question_group(db, text, vector, ids, vectors, groups)
            opened = group_id is None
            if opened:  # titled below, once the write transaction no longer holds the queue
                group_id = self._open_group(db, text, asked)
            question_id = db.execute(
                "INSERT INTO questions (text, asked, source, group_id, vector) VALUES (?, ?, ?, ?, ?)",
                (text, asked, source, group_id, vector.tobytes()),
            ).lastrowid
            version = self._changed(db)
            self._waiting = (
                version,
                np.append(ids, question_id),
                np.vstack([vectors.reshape(-1, vector.size), vector]),
                [*groups, str(group_id)],
            )
        if opened:
            self._summarized_title(group_id, text)
        return QueuedQuestion(int(question_id), text, asked, source, int(group_id))

    def _open_group(self, db: sqlite3.Connection, text: str, created: str) -> int:
        """A new waiting group of this index, titled `text` until the summarizer titles it."""
        return db.execute(
            "INSERT INTO groups (title, created, index_dir) VALUES (?, ?, ?)",
            (text[:TITLE_CHARS], created, self.index_dir),
        ).lastrowid

    def _same_question_group(
        self, db: sqlite3.Connection, text: str, vector: np.ndarray, ids: np.ndarray, vectors: np.ndarray, groups
    ) -> int | None:
        """The waiting group whose question is the same as `text` (the best such), or None."""
        if not len(ids):
            return None
        cosines = vectors @ vector
        order = np.argsort(-cosines, kind="stable")[: self.settings.candidates]
        order = [row for row in order if cosines[row] >= self.settings.floor]
        if not order:
            return None
        if self.detector is None:
            best = order[0]
            return int(groups[best]) if cosines[best] >= self.settings.same_cosine else None
        placeholders = ",".join("?" * len(order))
        texts = dict(
            db.execute(f"SELECT id, text FROM questions WHERE id IN ({placeholders})", [int(ids[r]) for r in order])
        )
        scores = self.detector.score(text, [texts[int(ids[row])] for row in order])
        best = int(np.argmax(scores))
        return int(groups[order[best]]) if scores[best] >= self._threshold() else None

    def _summarized_title(self, group_id: int, text: str) -> None:
        """Title a new group with the summarizer's question for `text`, outside any write transaction (the
        summarizer may take a second; meanwhile the group carries `text` itself)."""
        if self.titler is not None:
            title = self._title(text)
            with self._connection(write=True) as db:
                db.execute("UPDATE groups SET title = ? WHERE id = ?", (title, group_id))

    def _threshold(self) -> float:
        if self.settings.threshold is not None:
            return self.settings.threshold
        return float(getattr(self.detector, "decision_boundary", 0.5))

    def _title(self, text: str) -> str:
        """The titler's question for `text`, else (an empty one) `text` itself."""
        return (self.titler.rewrite([text])[0].strip() or text)[:TITLE_CHARS]

    def sync(self, log_path: str | Path | None = None) -> int:
        """Queue the questions the pipeline logged as unanswered (retriever/queue/unanswered.py) at `log_path` (default:
        the queue's `log`) about this index since the last sync: returns how many. The log's position is kept in
        the queue, per index (a log that was replaced is read from its start); one sync at a time per queue file,
        whatever the process."""
        from filelock import FileLock

        if log_path is None and self.log is None:
            raise MedfaqError("the experts' queue was opened without an unanswered log to read")
        log = Path(log_path).expanduser() if log_path is not None else self.log
        with FileLock(str(self.path) + ".sync.lock"):
            try:
                stat = log.stat()
            except FileNotFoundError:
                return 0
            with self._connection() as db:
                row = db.execute("SELECT value FROM meta WHERE key = ?", (self._log_key,)).fetchone()
            seen = json.loads(row[0]) if row else {}
            same_file = seen.get("path") == str(log.resolve()) and seen.get("inode") == stat.st_ino
            offset = seen.get("offset", 0) if same_file and seen.get("offset", 0) <= stat.st_size else 0
            added = 0
            with log.open("rb") as handle:
                handle.seek(offset)
                for line in handle:
                    if not line.endswith(b"\n"):
                        break  # a line still being written: read at the next sync
                    offset += len(line)
                    try:
                        entry = json.loads(line)
                        query, asked, asked_of = str(entry["query"]), entry.get("time"), entry.get("index")
                    except (ValueError, KeyError, TypeError, AttributeError):
                        continue  # not an entry of the log: nothing to queue
                    if query.strip() and (asked_of or self._first_index) == self.index_dir:
                        self.add(query, "abstained", asked)
                        added += 1
                    self._log_position(log, stat.st_ino, offset)
        return added

    def _log_position(self, log: Path, inode: int, offset: int) -> None:
        position = json.dumps({"path": str(log.resolve()), "inode": inode, "offset": offset})
        with self._connection(write=True) as db:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (self._log_key, position))

    # ---- reading --------------------------------------------------------------------------------------------------

    def groups(self, status: str | None = "waiting") -> list[QuestionGroup]:
        """This index's groups with `status` (None: all), most asked first, then most recently asked."""
        if status is not None and status not in STATUSES:
            raise MedfaqError(f"unknown group status {status!r}; choose one of {', '.join(STATUSES)}")
        with self._connection() as db:
            where, values = ("AND status = ?", (status,)) if status else ("", ())
            rows = db.execute(
                f"SELECT {GROUP_COLUMNS} FROM groups WHERE index_dir = ? {where}", (self.index_dir, *values)
            ).fetchall()
            found = [self._group(db, row) for row in rows]
        return sorted(found, key=lambda g: (-g.count, -max((q.id for q in g.questions), default=0)))

    def group(self, group_id: int) -> QuestionGroup:
        with self._connection() as db:
            return self._group(db, self._group_row(db, group_id))

    def _group_row(self, db: sqlite3.Connection, group_id: int) -> tuple:
        """The row of this index's group `group_id` (:data:`GROUP_COLUMNS`); another index's is unknown here."""
        row = db.execute(f"SELECT {GROUP_COLUMNS} FROM groups WHERE id = ?", (int(group_id),)).fetchone()
        if row is None:
            raise UnknownGroup(f"no group {group_id} in the experts' queue")
        if row[-1] != self.index_dir:
            raise UnknownGroup(f"group {group_id} belongs to another index's queue, not to {self.index_dir}'s")
        return row

    @staticmethod
    def _group(db: sqlite3.Connection, row: tuple) -> QuestionGroup:
        group_id, title, status, faq_id, resolved_by, resolved_at, index_version, _, _ = row
        questions = [
            QueuedQuestion(*values, group_id)
            for values in db.execute(
                "SELECT id, text, asked, source FROM questions WHERE group_id = ? ORDER BY id", (group_id,)
            )
        ]
        return QuestionGroup(group_id, title, status, questions, faq_id, resolved_by, resolved_at, index_version)

    # ---- an expert's edits ----------------------------------------------------------------------------------------

    def split(self, group_id: int, question_ids: list[int]) -> QuestionGroup:
        """Move `question_ids` of waiting group `group_id` into a new group. Each of the two is titled again from its
        first question: the old title may have been made from a question that moved."""
        with self._guard, self._connection(write=True) as db:
            group = self._waiting_group(db, group_id)
            moving = [q for q in group.questions if q.id in set(question_ids)]
            if not moving or len(moving) != len(set(question_ids)) or len(moving) == group.count:
                raise MedfaqError(
                    f"split needs some, not all, of group {group_id}'s question ids "
                    f"({', '.join(str(q.id) for q in group.questions)})"
                )
            staying = next(q for q in group.questions if q not in moving)
            new_id = self._open_group(db, moving[0].text, _now())
            db.executemany("UPDATE questions SET group_id = ? WHERE id = ?", [(new_id, q.id) for q in moving])
            db.execute("UPDATE groups SET title = ? WHERE id = ?", (staying.text[:TITLE_CHARS], group_id))
            self._changed(db)
        self._summarized_title(new_id, moving[0].text)
        self._summarized_title(group_id, staying.text)
        return self.group(new_id)

    def merge(self, group_ids: list[int]) -> QuestionGroup:
        """Move every question of the waiting groups `group_ids` into the first of them."""
        if len(set(group_ids)) < 2:
            raise MedfaqError("merge needs at least two different group ids")
        with self._guard, self._connection(write=True) as db:
            for group_id in group_ids:
                self._waiting_group(db, group_id)
            keep, *others = group_ids
            for other in others:
                db.execute("UPDATE questions SET group_id = ? WHERE group_id = ?", (keep, other))
                db.execute("DELETE FROM groups WHERE id = ?", (other,))
            self._changed(db)
            return self._group(db, self._group_row(db, keep))

    def retitle(self, group_id: int, title: str) -> QuestionGroup:
        title = " ".join(title.split())
        if not title:
            raise MedfaqError("a group's title cannot be empty")
        with self._guard, self._connection(write=True) as db:
            self._group_row(db, group_id)
            db.execute("UPDATE groups SET title = ? WHERE id = ?", (title[:TITLE_CHARS], group_id))
            return self._group(db, self._group_row(db, group_id))

    def _waiting_group(self, db: sqlite3.Connection, group_id: int) -> QuestionGroup:
        group = self._group(db, self._group_row(db, group_id))
        self._check_waiting(group)
        return group

    # ---- answering ------------------------------------------------------------------------------------------------

    def link(self, group_id: int, faq_id: str, by: str = "") -> QuestionGroup:
        """Answer group `group_id` with the existing FAQ `faq_id`: its questions become that FAQ's phrasings."""
        group = self.group(group_id)
        self._check_waiting(group)
        texts = [q.text for q in group.questions]
        index, added = FaqIndex.edit(
            self.index_dir,
            lambda index: index.editor().add_phrasings(faq_id, texts, by, _origin(group_id)),
            encoder=self.encoder,
        )
        return self._resolved(group_id, "linked", faq_id, by, index.version, {"phrasing_keys": [p.key for p in added]})

    def answer(self, group_id: int, question: str, answer: str, by: str = "") -> QuestionGroup:
        """Answer group `group_id` with a new FAQ (`question`, `answer`, source ``expert``), whose phrasings are the
        group's questions. The FAQ's id is ``expert-<group id>`` (``-2``, ``-3``... if taken)."""
        group = self.group(group_id)
        self._check_waiting(group)
        question, answer = " ".join(question.split()), answer.strip()
        if not question or not answer:
            raise MedfaqError("a new FAQ needs a question and an answer")

        def add_faq(index: FaqIndex) -> str:
            faq_id = _free_id(index, f"expert-{group_id}")
            record = FaqRecord(id=faq_id, question=question, answer=answer, source="expert")
            editor = index.editor()
            editor.add([record], progress=False)
            editor.add_phrasings(faq_id, [q.text for q in group.questions], by, _origin(group_id))
            return faq_id

        index, faq_id = FaqIndex.edit(self.index_dir, add_faq, encoder=self.encoder)
        return self._resolved(group_id, "answered", faq_id, by, index.version, {"faq_id": faq_id})

    def undo(self, group_id: int) -> QuestionGroup:
        """Take back a link (the phrasings it added leave the index) or an answer (its FAQ leaves the index, refused
        while other groups' phrasings lead to it); the group waits again. Only what the group added is removed: a
        phrasing under a recorded key that another change put there stays."""
        with self._connection() as db:
            row = self._group_row(db, group_id)
            group, undo_json = self._group(db, row), row[7]
        if group.status == "waiting" or not undo_json:
            raise MedfaqError(f"group {group_id} is waiting: there is nothing to undo")
        undo = json.loads(undo_json)
        if "faq_id" in undo:
            FaqIndex.edit(self.index_dir, lambda index: _delete_answer(index, undo["faq_id"], group_id))
        else:
            FaqIndex.edit(self.index_dir, lambda index: _remove_link(index, group, set(undo["phrasing_keys"])))
        return self._resolved(group_id, "waiting", None, None, None, None)

    @staticmethod
    def _check_waiting(group: QuestionGroup) -> None:
        if group.status != "waiting":
            raise MedfaqError(f"group {group.id} was already {group.status} (to FAQ {group.faq_id}); undo it first")

    def _resolved(
        self, group_id: int, status: str, faq_id: str | None, by: str | None, version: str | None, undo: Any
    ) -> QuestionGroup:
        at = _now() if status != "waiting" else None
        with self._guard, self._connection(write=True) as db:
            db.execute(
                "UPDATE groups SET status = ?, faq_id = ?, resolved_by = ?, resolved_at = ?, index_version = ?, "
                "undo = ? WHERE id = ?",
                (status, faq_id, by, at, version, json.dumps(undo) if undo else None, group_id),
            )
            self._changed(db)
            return self._group(db, self._group_row(db, group_id))


def _origin(group_id: int) -> str:
    """What a phrasing added by queue group `group_id` records as its origin."""
    return f"queue group {group_id}"


def _remove_link(index: FaqIndex, group: QuestionGroup, keys: set[int]) -> None:
    """Remove the phrasings under `keys` that `group`'s link added: its FAQ, its origin, one of its questions."""
    texts = {question.text for question in group.questions}
    added = [
        phrasing.key
        for phrasing in index.phrasings([group.faq_id])
        if phrasing.key in keys and phrasing.origin == _origin(group.id) and phrasing.text in texts
    ]
    index.editor().remove_phrasings(added)


def _delete_answer(index: FaqIndex, faq_id: str, group_id: int) -> None:
    """Delete the FAQ that group `group_id` answered with (if still there), unless other groups link to it."""
    if faq_id not in index:
        return
    others = sorted({p.origin or "another edit" for p in index.phrasings([faq_id]) if p.origin != _origin(group_id)})
    if others:
        raise MedfaqError(
            f"FAQ {faq_id} of group {group_id} also holds phrasings of {', '.join(others)}: undo those first"
        )
    index.editor().delete([faq_id])


def _free_id(index: FaqIndex, wanted: str) -> str:
    faq_id, number = wanted, 1
    while faq_id in index:
        number += 1
        faq_id = f"{wanted}-{number}"
    return faq_id


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def queue_beside(log_path: str | Path) -> Path:
    """The queue that groups the questions of the unanswered log at `log_path`: ``queue.sqlite3`` beside it."""
    return Path(log_path).expanduser().parent / QUEUE_FILE


def open_queue(index: FaqIndex, config: PipelineConfig) -> QuestionQueue:
    """The experts' queue for `index` searched with the pipeline `config`: beside the config's unanswered log,
    which it syncs from, its questions embedded with the index's encoder, its groups titled by the summarizer the
    config names (else the best one trained, when there is one; else the first question)."""
    from medfaq.retriever.queue.unanswered import UnansweredLog

    if index.directory is None:
        raise MedfaqError("the experts' queue belongs to an index on disk: save the index first")
    log = UnansweredLog(config.unanswered_log).path
    titles = SummarizerTitles(config)
    return QuestionQueue(queue_beside(log), index.encoder, titler=titles, log=log, index_dir=index.directory)


class SummarizerTitles:
    """The summarizer `config` names (else the best one trained) as a queue's titler, loaded when the first new group
    needs a title: listing, linking or answering never loads it. Without a summarizer a title is the question."""

    def __init__(self, config: PipelineConfig) -> None:
        self.config = config
        self._summarizer: QueryRewriter | None = None
        self._missing = False

    def rewrite(self, texts: list[str]) -> list[str]:
        if self._summarizer is None and not self._missing:
            from medfaq.retriever.model_cache import shared_cache

            try:
                self._summarizer = shared_cache().stage("rewrite", self.config.summarizer, self.config)
            except MedfaqError:
                self._missing = True
        return self._summarizer.rewrite(texts) if self._summarizer is not None else list(texts)
