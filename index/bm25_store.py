"""BM25 over FAQ text with bm25s (English stopwords), saved as bm25s' own npy/JSON files (no pickle).

Document `i` of the bm25s index belongs to row key ``keys[i]``. Deleting marks the row's key as -1, so deletes
need no re-indexing (term statistics are refreshed at the next rebuild, which `FaqIndex.add` does).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np

from medfaq.common.runtime import MedfaqError, import_bm25s, plural

bm25s = import_bm25s()

logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its own logger to DEBUG on import

KEYS_FILE = "keys.npy"
STOPWORDS = "en"


def tokenize(texts: list[str]) -> list[list[str]]:
    """Lower-cased word tokens without English stopwords (the same for documents and queries)."""
    return bm25s.tokenize(list(texts), stopwords=STOPWORDS, return_ids=False, show_progress=False)


class Bm25Index:
    """Keyword search over one text per row key."""

    def __init__(self, model: bm25s.BM25 | None, keys: np.ndarray) -> None:
        self.model = model
        self.keys = np.asarray(keys, dtype=np.int64)

    @classmethod
    def build(cls, texts: list[str], keys: np.ndarray) -> Bm25Index:
        """BM25 over `texts`; texts none of which holds a word to search (stopwords, one-letter words and punctuation
        are no such words) are a one-line error: an index of them could never match a keyword."""
        if len(texts) == 0:
            return cls(None, np.zeros(0, dtype=np.int64))
        tokens = tokenize(texts)
        if not any(tokens):
            raise MedfaqError(
                f"no text to index holds a word to search ({plural(len(texts), 'text')}, e.g. {texts[0][:80]!r}: "
                "only stopwords, one-letter words or punctuation); give the FAQs questions with words"
            )
        model = bm25s.BM25()
        model.index(tokens, show_progress=False)
        return cls(model, keys)

    def __len__(self) -> int:
        return int((self.keys >= 0).sum())

    def delete(self, keys: np.ndarray) -> int:
        hit = np.isin(self.keys, np.asarray(keys, dtype=np.int64)) & (self.keys >= 0)
        self.keys[hit] = -1
        return int(hit.sum())

    def search(self, queries: list[str], k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores, keys), each (len(queries), k); rows with fewer than k matching documents end in -1 keys."""
        scores_out = np.full((len(queries), max(k, 0)), -np.inf, dtype=np.float32)
        keys_out = np.full((len(queries), max(k, 0)), -1, dtype=np.int64)
        if self.model is None or k <= 0:
            return scores_out, keys_out
        mask = self.keys >= 0
        if allowed is not None:
            mask &= np.isin(self.keys, np.asarray(allowed, dtype=np.int64))
        for row, tokens in enumerate(tokenize(queries)):
            token_ids = self.model.get_tokens_ids(tokens)
            if not token_ids:
                continue
            scores = self.model.get_scores_from_ids(token_ids) * mask
            matching = np.flatnonzero(scores > 0)
            top = matching[np.argsort(-scores[matching], kind="stable")[:k]]
            scores_out[row, : len(top)] = scores[top]
            keys_out[row, : len(top)] = self.keys[top]
        return scores_out, keys_out

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        np.save(directory / KEYS_FILE, self.keys, allow_pickle=False)
        if self.model is not None:
            self.model.save(str(directory), show_progress=False)

    @classmethod
    def load(cls, directory: Path) -> Bm25Index:
        keys = np.load(directory / KEYS_FILE, allow_pickle=False)
        model = bm25s.BM25.load(str(directory), show_progress=False) if len(keys) else None
        return cls(model, keys)

    @classmethod
    def from_files(cls, files: dict[str, bytes]) -> Bm25Index:
        """The index whose saved files (name -> content, as :meth:`save` wrote them) are `files`."""
        with tempfile.TemporaryDirectory(prefix="medfaq-bm25-") as directory:
            for name, content in files.items():
                (Path(directory) / name).write_bytes(content)
            return cls.load(Path(directory))
