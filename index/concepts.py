"""Concept synonyms for FAQ encoding: an FAQ that names a known concept is also encoded with its other names.

A small encoder knows "Menkes syndrome" but not that a question about it matches "What are the treatments for kinky
hair syndrome?". A :class:`ConceptLexicon` holds concepts, each a list of names (MedQuAD's focus and its synonym
list, ``medquad.jsonl``), and finds them in a question by longest match over lower-cased word tokens. The index
encodes such an FAQ twice, as written and with up to `max_names` names of each concept it mentions appended in
brackets, and stores the normalised sum of the two vectors (:meth:`FaqIndex.add`): the FAQ keeps its own wording's
vector and moves towards its synonyms. Queries are encoded as written, so search costs nothing more.

Only surface forms that name one concept and are at least :data:`MIN_FORM_CHARS` characters long are matched
(not "ms", not "cancer"); the lexicon is saved inside the index (``concepts.jsonl``) so later additions use it too.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from medfaq.common.runtime import MedfaqError

CONCEPTS_FILE = "concepts.jsonl"
SOURCES = ("auto", "medquad", "none")
MAX_NAMES = 4  # names appended per concept found (the focus first, then the shortest synonyms)
MIN_FORM_CHARS = 4
GENERIC_FORMS = frozenset("the a an of and or in on for to with is are disease syndrome cancer".split())
_TOKEN = re.compile(r"[a-z0-9]+")


class ExpandedText(str):
    """An FAQ's text with its concepts' other names appended, remembering the text as `written`: a bi-encoder
    that scores it encodes it as the index did (:func:`combined_vectors` of the two texts' vectors)."""

    written: str

    def __new__(cls, text: str, written: str) -> ExpandedText:
        expanded = super().__new__(cls, text)
        expanded.written = written
        return expanded

    def __reduce__(self) -> tuple[type[ExpandedText], tuple[str, str]]:
        return ExpandedText, (str(self), self.written)


def read_with_concepts(lexicon: ConceptLexicon | None, question: str) -> str:
    """`question` as a reranker reads it over an index encoded with `lexicon`: with its concepts' other names (an
    :class:`ExpandedText`) when it names one, else as written."""
    expanded = lexicon.expand(question) if lexicon is not None else question
    return ExpandedText(expanded, question) if expanded != question else question


def combined_vectors(written: np.ndarray, expanded: np.ndarray) -> np.ndarray:
    """The vectors of FAQs that name a concept: the normalised sum of the vectors of their written and expanded
    texts (rows)."""
    summed = written + expanded
    return summed / np.linalg.norm(summed, axis=-1, keepdims=True).clip(min=1e-12)


def normalise(text: str) -> str:
    """Lower-cased word tokens joined by single spaces: the form names are matched in."""
    return " ".join(_TOKEN.findall(text.lower()))


class ConceptLexicon:
    """Concepts (lists of names, the preferred name first) and the unambiguous surface forms that find them."""

    def __init__(self, concepts: list[list[str]], source: str = "", max_names: int = MAX_NAMES) -> None:
        self.concepts = concepts
        self.source = source
        self.max_names = max_names
        owners: dict[str, set[int]] = defaultdict(set)
        for number, names in enumerate(concepts):
            for name in names:
                owners[normalise(name)].add(number)
        self._form_to_concept = {
            form: next(iter(found))
            for form, found in owners.items()
            if len(found) == 1 and len(form) >= MIN_FORM_CHARS and form not in GENERIC_FORMS
        }
        self._max_words = max((form.count(" ") + 1 for form in self._form_to_concept), default=0)

    @classmethod
    def from_rows(cls, rows: Iterable[dict], source: str = "", max_names: int = MAX_NAMES) -> ConceptLexicon:
        """Concepts from rows with a ``focus`` and optional ``synonyms`` (MedQuAD's rows): one concept per focus,
        its synonyms merged over the rows that share it, shortest first."""
        focus_of: dict[str, str] = {}
        synonyms: dict[str, set[str]] = defaultdict(set)
        for row in rows:
            focus = row.get("focus")
            key = normalise(focus) if isinstance(focus, str) else ""
            if not key:
                continue
            focus_of.setdefault(key, focus.strip())
            listed = row.get("synonyms")
            names = listed if isinstance(listed, list) else []
            synonyms[key].update(name.strip() for name in names if isinstance(name, str) and name.strip())
        concepts = []
        for key, focus in focus_of.items():
            names, seen = [focus], {key}
            for name in sorted(synonyms[key], key=lambda s: (len(s), s)):
                form = normalise(name)
                if form and form not in seen and form not in GENERIC_FORMS:
                    seen.add(form)
                    names.append(name)
            concepts.append(names)
        return cls(concepts, source, max_names)

    @classmethod
    def from_jsonl(cls, path: Path, source: str = "", max_names: int = MAX_NAMES) -> ConceptLexicon:
        """Read a JSONL file of ``{"focus": ..., "synonyms": [...]}`` rows (``medquad.jsonl`` is one)."""
        rows = []
        try:
            with path.open(encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
                    if line.strip():
                        rows.append(json.loads(line))
        except ValueError:  # malformed JSON or not UTF-8
            raise MedfaqError(f"{path}:{number}: not a JSON line; --synonyms reads JSONL") from None
        except OSError as error:
            raise MedfaqError(f"cannot read concepts from {path} ({error.strerror})") from None
        lexicon = cls.from_rows((row for row in rows if isinstance(row, dict)), source or str(path), max_names)
        if not lexicon.concepts:
            raise MedfaqError(f"{path} holds no concepts (lines with a 'focus' and a 'synonyms' list)")
        return lexicon

    def names_in(self, text: str) -> list[str]:
        """The other names of the concepts `text` mentions (longest match first), at most `max_names` per concept."""
        tokens = _TOKEN.findall(text.lower())
        names: list[str] = []
        position = 0
        while position < len(tokens):
            for width in range(min(self._max_words, len(tokens) - position), 0, -1):
                form = " ".join(tokens[position : position + width])
                if form in self._form_to_concept:
                    for name in self.concepts[self._form_to_concept[form]][: self.max_names]:
                        if normalise(name) != form and name not in names:
                            names.append(name)
                    position += width
                    break
            else:
                position += 1
        return names

    def expand(self, text: str, question: str | None = None) -> str:
        """`text` with the other names of the concepts in `question` (default: `text`) appended in brackets."""
        names = self.names_in(text if question is None else question)
        return f"{text} ({'; '.join(names)})" if names else text

    def describe(self) -> dict[str, object]:
        """What the index manifest records about the lexicon."""
        return {
            "source": self.source,
            "concepts": len(self.concepts),
            "surface_forms": len(self._form_to_concept),
            "max_names": self.max_names,
            "fingerprint": self.fingerprint,
        }

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256(f"{self.max_names}".encode())
        for names in self.concepts:
            digest.update(b"\0" + "\x1f".join(names).encode("utf-8", "surrogatepass"))
        return digest.hexdigest()[:16]

    def save(self, path: Path) -> None:
        with path.open("w", encoding="utf-8") as handle:
            for names in self.concepts:
                handle.write(json.dumps(names, ensure_ascii=False) + "\n")

    @classmethod
    def load(cls, path: Path, described: dict[str, object]) -> ConceptLexicon:
        """The lexicon saved by :meth:`save`, with the settings the manifest `described`."""
        return cls.parse(path.read_bytes(), described)

    @classmethod
    def parse(cls, saved: bytes, described: dict[str, object]) -> ConceptLexicon:
        """The lexicon from the bytes :meth:`save` wrote, with the settings the manifest `described`."""
        concepts = [json.loads(line) for line in saved.decode("utf-8").splitlines() if line.strip()]
        return cls(concepts, str(described.get("source", "")), int(described.get("max_names", MAX_NAMES)))


def concept_lexicon(spec: str, max_names: int = MAX_NAMES) -> ConceptLexicon | None:
    """The lexicon `--synonyms SPEC` asks for: ``medquad`` (the fetched MedQuAD dataset), ``auto`` (MedQuAD when
    fetched, else none), ``none``, or the path of a JSONL file of focus/synonyms rows."""
    from medfaq.index.datasets import dataset_collection_path, is_fetched

    if spec == "none":
        return None
    if spec in ("auto", "medquad"):
        if is_fetched("medquad"):
            return ConceptLexicon.from_jsonl(dataset_collection_path("medquad"), "medquad", max_names)
        if spec == "auto":
            return None
        raise MedfaqError("--synonyms medquad needs the MedQuAD dataset; run `medfaq data fetch medquad`")
    path = Path(spec).expanduser()
    if not path.is_file():
        raise MedfaqError(f"--synonyms {spec!r} is neither {', '.join(SOURCES)} nor a JSONL file")
    return ConceptLexicon.from_jsonl(path, max_names=max_names)
