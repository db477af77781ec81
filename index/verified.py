"""What a load already verified: the checksum each index file matched, with the file's identity and times then.

A load hashes a file again unless it is the very file that was verified (same device, inode, size, mtime and
ctime: any write, replacement, ``touch`` or ``chmod`` changes one of them) and was already old when it was hashed
(ctime at least :data:`SETTLED_S` before, so a change within the file system's timestamp granularity cannot hide
behind equal times). Kept per index under ``$MEDFAQ_HOME/cache/verified``; an unreadable or unwritable cache
only means hashing again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from medfaq.common.runtime import cache_dir, write_cache

SETTLED_S = 2.0

Signature = list[int | str]
"""[device, inode, size, mtime ns, ctime ns, sha256]."""


def signature(stat: os.stat_result, checksum: str) -> Signature:
    return [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, checksum]


def settled(stat: os.stat_result, hashed_at_ns: int) -> bool:
    """Whether the file had not changed for :data:`SETTLED_S` when it was hashed at `hashed_at_ns`."""
    return max(stat.st_mtime_ns, stat.st_ctime_ns) <= hashed_at_ns - SETTLED_S * 1e9


def cache_file(directory: Path) -> Path:
    key = hashlib.sha256(str(directory.resolve()).encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return cache_dir() / "verified" / f"{key}.json"


def recall(directory: Path) -> dict[str, Signature]:
    """The signatures of the files of `directory` verified before (empty when none or unreadable)."""
    try:
        data = json.loads(cache_file(directory).read_bytes())
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return files if isinstance(files, dict) else {}


def remember(directory: Path, files: dict[str, Signature]) -> None:
    """Record the verified files of `directory`."""
    write_cache(cache_file(directory), json.dumps({"directory": str(directory.resolve()), "files": files}))
