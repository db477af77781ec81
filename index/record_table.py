"""The FAQ records of an index by row key, read on demand.

An index directory keeps them as::

    records.jsonl         one FaqRecord per line
    keys.npy              int64 row key of each line
    records.offsets.npy   int64 byte offset where each line starts, then the file's size
    records.ids           the id of each line, one JSON array

A loaded table holds the keys and ids alone and parses a record when it is asked for (a search parses its hits,
not the 47,441 MedQuAD records), reading through a handle opened at load time, so a save that swaps the directory
meanwhile never mixes two versions. In a directory saved before the offsets and ids were written, they are found
by scanning the lines (the id leads each line as it was written; a line where it does not is parsed whole); its
next save writes them.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from medfaq.common.runtime import IndexCorrupt
from medfaq.index.records import FaqRecord

RECORDS = "records.jsonl"
KEYS = "keys.npy"
OFFSETS = "records.offsets.npy"
IDS = "records.ids"
LEADING_ID = re.compile(rb'\{"id": ("(?:[^"\\]|\\.)*"), ')
"""The id of a line as :func:`index.collections.write_records` writes it: the first key, a JSON string."""


class RecordFile:
    """``records.jsonl`` open for reading single lines by their byte offsets."""

    def __init__(self, path: Path, offsets: np.ndarray) -> None:
        self.path = path
        self.offsets = offsets
        self._handle: BinaryIO = path.open("rb", buffering=0)
        self._lock = threading.Lock()
        weakref.finalize(self, self._handle.close)

    def line(self, row: int) -> bytes:
        start, end = int(self.offsets[row]), int(self.offsets[row + 1])
        with self._lock:
            self._handle.seek(start)
            data = self._handle.read(end - start)
        if len(data) != end - start:
            raise corrupt(self.path.parent, f"{RECORDS} line {row + 1} is cut short")
        return data

    def record(self, row: int) -> FaqRecord:
        try:
            return FaqRecord.from_dict(json.loads(self.line(row)))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise corrupt(self.path.parent, f"{RECORDS} line {row + 1}: {error}") from None


class RecordTable:
    """Records by row key in insertion order: ids in memory, records in memory or read from a :class:`RecordFile`."""

    def __init__(self, keys: Iterable[int] = (), records: Iterable[FaqRecord] = ()) -> None:
        self._held: dict[int, FaqRecord] = dict(zip((int(key) for key in keys), records, strict=True))
        self._id_of: dict[int, str] = {key: record.id for key, record in self._held.items()}
        self._key_of: dict[str, int] = {faq_id: key for key, faq_id in self._id_of.items()}
        self._file: RecordFile | None = None
        self._row_of: dict[int, int] = {}  # key -> line of `_file`, for the records not held

    @classmethod
    def open(cls, directory: Path) -> RecordTable:
        """The table saved in `directory`: ids now, records on demand."""
        keys = np.load(directory / KEYS, allow_pickle=False)
        if (directory / OFFSETS).is_file():
            offsets = np.load(directory / OFFSETS, allow_pickle=False)
            ids = json.loads((directory / IDS).read_bytes())
        else:
            offsets, ids = scan_lines(directory / RECORDS)
        if not len(keys) == len(ids) == len(offsets) - 1:
            raise corrupt(directory, f"{len(keys)} keys, {len(ids)} ids, {len(offsets) - 1} offsets")
        table = cls()
        table._file = RecordFile(directory / RECORDS, offsets)
        table._row_of = {key: row for row, key in enumerate(keys.tolist())}
        table._id_of = dict(zip(table._row_of, map(str, ids), strict=True))
        table._key_of = {faq_id: key for key, faq_id in table._id_of.items()}
        if len(table._key_of) != len(table._id_of):
            raise corrupt(directory, f"an FAQ id appears twice in {IDS}")
        return table

    def __len__(self) -> int:
        return len(self._id_of)

    def __contains__(self, key: int) -> bool:
        return key in self._id_of

    def key_of(self, faq_id: str) -> int | None:
        return self._key_of.get(faq_id)

    def id_of(self, key: int) -> str | None:
        return self._id_of.get(key)

    def get(self, key: int) -> FaqRecord:
        record = self._held.get(key)
        if record is not None:
            return record
        assert self._file is not None, key
        return self._file.record(self._row_of[key])

    def keys(self) -> np.ndarray:
        return np.fromiter(self._id_of, dtype=np.int64, count=len(self._id_of))

    def ids(self) -> list[str]:
        return list(self._id_of.values())

    def values(self) -> Iterator[FaqRecord]:
        return (self.get(key) for key in self._id_of)

    def copy(self) -> RecordTable:
        """A table with the same records whose later changes leave this one as it is."""
        other = RecordTable()
        other._held, other._id_of, other._key_of = dict(self._held), dict(self._id_of), dict(self._key_of)
        other._file, other._row_of = self._file, dict(self._row_of)
        return other

    def add(self, keys: Iterable[int], records: Iterable[FaqRecord]) -> None:
        for key, record in zip(keys, records, strict=True):
            key = int(key)
            self._held[key] = record
            self._id_of[key] = record.id
            self._key_of[record.id] = key

    def delete(self, keys: Iterable[int]) -> None:
        for key in keys:
            del self._key_of[self._id_of.pop(key)]
            self._held.pop(key, None)
            self._row_of.pop(key, None)

    def save(self, directory: Path) -> None:
        """Write records.jsonl, keys.npy, records.offsets.npy and records.ids into `directory`; a record read from
        a file is copied as its bytes, not parsed and written again."""
        offsets = np.zeros(len(self) + 1, dtype=np.int64)
        with (directory / RECORDS).open("wb") as handle:
            for row, key in enumerate(self._id_of):
                record = self._held.get(key)
                if record is None:
                    assert self._file is not None, key
                    line = self._file.line(self._row_of[key])
                    line += b"" if line.endswith(b"\n") else b"\n"  # the last line of a file without a final one
                else:
                    line = (json.dumps(record.to_dict(), ensure_ascii=False) + "\n").encode("utf-8")
                handle.write(line)
                offsets[row + 1] = offsets[row] + len(line)
        np.save(directory / KEYS, self.keys(), allow_pickle=False)
        np.save(directory / OFFSETS, offsets, allow_pickle=False)
        (directory / IDS).write_text(json.dumps(self.ids(), ensure_ascii=False) + "\n", encoding="utf-8")


def scan_lines(path: Path) -> tuple[np.ndarray, list[str]]:
    """Where each record of a records.jsonl saved without offsets starts (then the file's size), and its id; a
    record's bytes run to the next one's start, blank lines included."""
    data = path.read_bytes()
    starts, ids, position = [], [], 0
    for line in data.split(b"\n"):
        if line.strip():
            leading = LEADING_ID.match(line)
            ids.append(json.loads(leading.group(1)) if leading else str(json.loads(line)["id"]))
            starts.append(position)
        position += len(line) + 1
    return np.array([*starts, len(data)], dtype=np.int64), ids


def corrupt(directory: Path, why: str) -> IndexCorrupt:
    """The one-line error for a damaged index directory."""
    return IndexCorrupt(f"index {directory} is corrupt ({why}); rebuild it")
