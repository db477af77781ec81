"""Resumable encoding: texts encoded in chunks, each kept in a staging directory until the whole is done.

With a staging directory, encoded vectors are written there chunk by chunk next to a progress record
(`progress.json`), and an encoding that was killed encodes only the chunks still missing when it is run again over
the same texts with the same encoder (a large `index build --resume`, an adaptation's rows, a teacher's vectors).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from medfaq.common.runtime import MedfaqError

logger = logging.getLogger("medfaq.index")

ENCODE_CHUNK = 512  # texts per encode call (progress and resume granularity)
PROGRESS = "progress.json"
CHUNK_FILE = "chunk-{:07d}.npy"


def staging_dir(directory: str | Path) -> Path:
    """Where a build of `directory` keeps its encoded chunks until the index is saved: ``.NAME.building`` beside it."""
    target = Path(directory).expanduser().resolve()
    return target.parent / f".{target.name}.building"


def chunks_fingerprint(identity: str, texts: list[str]) -> str:
    """Identifies what a staging directory holds: `identity` (e.g. the encoder and the fields encoded), the chunk
    size and every text."""
    digest = hashlib.sha256(f"{identity}\0{ENCODE_CHUNK}".encode())
    for text in texts:
        digest.update(b"\0" + text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def encode_chunks(
    encode: Callable[[list[str]], np.ndarray],
    texts: list[str],
    dim: int,
    staging: Path | None,
    fingerprint: str,
    progress: bool = True,
    desc: str = "encoding FAQ texts",
) -> np.ndarray:
    """Encode `texts` in chunks of ENCODE_CHUNK; with `staging`, keep each chunk on disk and skip those already there.

    `staging/progress.json` records the `fingerprint` and how many chunks are done; each chunk file is complete
    before the record counts it, so a kill at any point loses at most the chunk being encoded.
    """
    from tqdm.auto import tqdm

    starts = range(0, len(texts), ENCODE_CHUNK)
    done = _staged_chunks(staging, fingerprint, len(texts)) if staging is not None else 0
    bar = tqdm(total=len(texts), desc=desc, unit="text", disable=not progress)
    parts = []
    with bar:
        for number, start in enumerate(starts):
            chunk = texts[start : start + ENCODE_CHUNK]
            if staging is None:
                parts.append(encode(chunk))
            else:
                if number >= done:
                    vectors = encode(chunk)
                    _atomic_write(staging / CHUNK_FILE.format(number), lambda path: np.save(path, vectors))
                    record = json.dumps({"fingerprint": fingerprint, "texts": len(texts), "chunks_done": number + 1})
                    _atomic_write(staging / PROGRESS, lambda path: path.write_text(record + "\n", encoding="utf-8"))
                parts.append(np.load(staging / CHUNK_FILE.format(number), mmap_mode="r"))
            bar.update(len(chunk))
    return np.concatenate(parts).astype(np.float32, copy=False) if parts else np.zeros((0, dim), dtype=np.float32)


def _staged_chunks(staging: Path, fingerprint: str, total: int) -> int:
    """How many chunks `staging` already holds for this fingerprint (0 for a new staging directory)."""
    staging.mkdir(parents=True, exist_ok=True)
    if not (staging / PROGRESS).is_file():
        return 0
    try:
        record = json.loads((staging / PROGRESS).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        record = {}
    if record.get("fingerprint") != fingerprint or record.get("texts") != total:
        raise MedfaqError(
            f"{staging} holds a partial build of other texts or another encoder; build without --resume to start over"
        )
    done = int(record["chunks_done"])
    if done:
        logger.warning("resuming: %d of %d chunks already encoded in %s", done, -(-total // ENCODE_CHUNK), staging)
    return done


def _atomic_write(path: Path, write: Callable[[Path], Any]) -> None:
    """Write `path` through a temporary file and a rename, so it is either complete or absent."""
    partial = path.with_name(f".{path.name}.partial{path.suffix}")
    write(partial)
    os.replace(partial, path)
