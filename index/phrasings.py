"""Other wordings of an FAQ's question: each has its own vector and BM25 row under its own key, and a search that
matches it returns the FAQ it belongs to. Experts add them when they link the questions users asked to an FAQ.

Saved in the index directory as ``phrasings.jsonl``, one :class:`Phrasing` per line (absent while there are none).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from medfaq.common.runtime import IndexCorrupt, MedfaqError

PHRASINGS_FILE = "phrasings.jsonl"


@dataclass(frozen=True)
class Phrasing:
    """`text` searched as FAQ `faq_id` under row `key`; `added` (UTC, ISO), `by` (who) and `origin` (e.g. the
    queue group it came from) say where it came from."""

    key: int
    faq_id: str
    text: str
    added: str = ""
    by: str = ""
    origin: str = ""


class PhrasingTable:
    """The phrasings of an index by row key."""

    def __init__(self, phrasings: Iterable[Phrasing] = ()) -> None:
        self._by_key: dict[int, Phrasing] = {}
        self._by_faq: dict[str, dict[int, Phrasing]] = {}
        self._largest_first: list[int] | None = None  # the FAQs' phrasing counts, largest first (cached)
        self.add(phrasings)

    def __len__(self) -> int:
        return len(self._by_key)

    def __iter__(self) -> Iterator[Phrasing]:
        return iter(self._by_key.values())

    def faq_of(self, key: int) -> str | None:
        phrasing = self._by_key.get(key)
        return phrasing.faq_id if phrasing else None

    def of_faqs(self, faq_ids: Iterable[str]) -> list[Phrasing]:
        return [phrasing for faq_id in dict.fromkeys(faq_ids) for phrasing in self._by_faq.get(faq_id, {}).values()]

    def get(self, keys: Iterable[int]) -> list[Phrasing]:
        """The phrasings under `keys`; an unknown key is a one-line error naming it."""
        missing = [key for key in keys if key not in self._by_key]
        if missing:
            raise MedfaqError(f"no phrasing with key(s) {', '.join(map(str, missing[:5]))} in the index")
        return [self._by_key[key] for key in keys]

    def most_of(self, faqs: int) -> int:
        """How many phrasings the `faqs` FAQs with the most phrasings hold together."""
        if self._largest_first is None:
            self._largest_first = sorted((len(group) for group in self._by_faq.values()), reverse=True)
        return sum(self._largest_first[: max(faqs, 0)])

    def copy(self) -> PhrasingTable:
        return PhrasingTable(self._by_key.values())

    def add(self, phrasings: Iterable[Phrasing]) -> None:
        self._largest_first = None
        for phrasing in phrasings:
            self._by_key[phrasing.key] = phrasing
            self._by_faq.setdefault(phrasing.faq_id, {})[phrasing.key] = phrasing

    def remove(self, keys: Iterable[int]) -> None:
        self._largest_first = None
        for key in keys:
            phrasing = self._by_key.pop(key, None)
            if phrasing is not None:
                self._by_faq[phrasing.faq_id].pop(key, None)

    def save(self, directory: Path) -> None:
        """Write ``phrasings.jsonl`` into `directory` (nothing when there are none)."""
        if self._by_key:
            lines = (json.dumps(asdict(phrasing), ensure_ascii=False) + "\n" for phrasing in self._by_key.values())
            (directory / PHRASINGS_FILE).write_text("".join(lines), encoding="utf-8")

    @classmethod
    def load(cls, directory: Path) -> PhrasingTable:
        path = directory / PHRASINGS_FILE
        if not path.is_file():
            return cls()
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                rows.append(Phrasing(**json.loads(line)))
            except (ValueError, TypeError) as error:
                raise IndexCorrupt(f"index {directory} is corrupt ({PHRASINGS_FILE} line {number}: {error})") from None
        return cls(rows)
