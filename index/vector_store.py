"""The vector-store interface that FAISS (in-process) and Milvus (server or Milvus Lite) backends implement.

A store that keeps its vectors outside the index directory (Milvus) applies `add`/`delete` to them at once; `add`
then replaces vectors left under the same keys by a change whose save never completed.

Vectors are float32, L2-normalised, scored by inner product. Keys are non-negative int64 row keys that
`FaqIndex` maps to FAQ ids; a store never sees FAQ text.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # imported where vectors are handled, so that the command line starts without it
    import numpy as np

INDEX_KINDS = ("flat", "ivf", "hnsw")
"""Index kinds every backend offers: exact, inverted lists, HNSW graph."""


@runtime_checkable
class VectorStore(Protocol):
    """What `FaqIndex` needs from a vector backend."""

    dim: int

    @property
    def thread_safe(self) -> bool:
        """Whether `search` may run in several threads at once (between changes)."""

    def add(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Insert `vectors` (n, dim) under int64 `keys` (n,)."""

    def delete(self, keys: np.ndarray) -> int:
        """Remove the given keys; return how many were removed."""

    def search(self, queries: np.ndarray, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product for each query: (scores (q, k) float32, keys (q, k) int64, -1 where fewer).

        `allowed`, when given, restricts the search to those keys (how metadata filters are applied).
        """

    def __len__(self) -> int:
        """Number of stored vectors."""

    def export(self, batch: int = 100_000) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every stored (keys, vectors), in batches of at most `batch` rows: how an index moves between backends."""

    def save(self, directory: Path) -> None:
        """Write the store's files into `directory` (the caller makes the save atomic)."""

    def backend_config(self) -> dict:
        """JSON-serialisable options for the manifest's backend section; :meth:`load` receives them back."""

    @classmethod
    def load(cls, directory: Path, config: dict) -> VectorStore:
        """Open a store saved by :meth:`save`; `config` is the backend section of the index manifest."""

    @classmethod
    def discard(cls, config: dict, current: dict) -> None:
        """Release what a replaced index (`config`) kept outside its directory, unless `current` still uses it.

        A Milvus collection is dropped; FAISS keeps nothing outside the directory.
        """


def checked_rows(keys: np.ndarray, vectors: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """`keys` as contiguous int64 and `vectors` as contiguous float32 (n, dim); a shape mismatch is a one-line error."""
    import numpy as np

    from medfaq.common.runtime import MedfaqError

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise MedfaqError(f"vectors of shape {vectors.shape} do not match the index dimension {dim}")
    return np.ascontiguousarray(keys, dtype=np.int64), vectors


VECTOR_BACKENDS: dict[str, str] = {
    "faiss": "medfaq.index.faiss_store:FaissStore",
    "milvus": "medfaq.index.milvus_store:MilvusStore",
}
"""Backend name (as written in the manifest's backend section) -> "module:Class" of its VectorStore.

A backend class is created as ``cls(dim=..., **options)``, reopened with ``cls.load(directory, config)``, and
reports its options for the manifest with ``backend_config() -> dict``.
"""


def register_backend(name: str, target: str) -> None:
    """Make a vector backend available by name, e.g.
    ``register_backend("milvus", "medfaq.index.milvus_store:MilvusStore")``."""
    VECTOR_BACKENDS[name] = target


def backend_class(name: str) -> type:
    """Import the class registered under `name`; unknown names give a one-line error."""
    import importlib

    from medfaq.common.runtime import MedfaqError

    if name not in VECTOR_BACKENDS:
        raise MedfaqError(f"unknown vector backend {name!r}; known: {', '.join(sorted(VECTOR_BACKENDS))}")
    module_name, _, class_name = VECTOR_BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)
