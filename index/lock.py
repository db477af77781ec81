"""The write lock of an index directory: ``.NAME.lock`` beside it (the `filelock` package), held by every write.

A second write says once that it waits, and gives up with a one-line error after ``--lock-timeout`` seconds
(``$MEDFAQ_LOCK_TIMEOUT``, else 600), having changed nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from medfaq.common.runtime import MedfaqError

logger = logging.getLogger("medfaq.index")

LOCK_TIMEOUT_ENV = "MEDFAQ_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT = 600.0  # seconds a write waits for another write to finish


def lock_file(directory: str | Path) -> Path:
    """The lock file of the index at `directory`: ``.NAME.lock`` beside it (the directory itself is swapped)."""
    target = Path(directory).expanduser().resolve()
    return target.parent / f".{target.name}.lock"


_held = threading.local()


@contextmanager
def write_lock(directory: str | Path, timeout: float | None = None) -> Iterator[Path]:
    """Hold the exclusive write lock of the index at `directory` (re-entrant in a thread); yields the resolved path.

    Every change of an index directory happens under it, sidecar files such as ``pipeline.json`` included. When
    another write holds it, one line says so and the call waits up to `timeout` seconds (default
    ``$MEDFAQ_LOCK_TIMEOUT`` or 600), then fails with a one-line error, having changed nothing.
    """
    from filelock import FileLock, Timeout

    target = Path(directory).expanduser().resolve()
    held: set[Path] = _held.__dict__.setdefault("paths", set())
    if target in held:
        yield target
        return
    wait = lock_timeout() if timeout is None else timeout
    path = lock_file(target)
    if not path.parent.is_dir():
        raise MedfaqError(f"index directory not found: {target}")
    lock = FileLock(path)
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            logger.warning("waiting for the lock on %s held by another write...", target)
            lock.acquire(timeout=wait)
    except Timeout:
        raise MedfaqError(
            f"index {target} is still locked by another write after {wait:g} s; nothing was changed "
            f"(try again when it finishes, or wait longer with --lock-timeout or ${LOCK_TIMEOUT_ENV})"
        ) from None
    except OSError as error:
        raise MedfaqError(f"cannot lock index {target}: {path}: {error.strerror or error}") from None
    held.add(target)
    try:
        yield target
    finally:
        held.discard(target)
        lock.release()


def lock_timeout() -> float:
    """Seconds a write waits for the lock: ``$MEDFAQ_LOCK_TIMEOUT`` or :data:`DEFAULT_LOCK_TIMEOUT`."""
    text = os.environ.get(LOCK_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_LOCK_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise MedfaqError(f"${LOCK_TIMEOUT_ENV} must be a number of seconds >= 0, not {text!r}")
    return value
