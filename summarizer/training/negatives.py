"""Hard negatives for contrastive summarizer training: swap the entities (ECL) or focus phrases (QFCL) of a FAQ.

For FAQ i, every recognised span is replaced, at its character span (never by string search), with a term drawn
from the dictionary D of all spans of all given FAQs (case-folded, de-duplicated) minus FAQ i's own terms. The
result is one group per FAQ, in input order. A negative never equals its positive or another negative of the same
group (compared case- and space-normalised). Each FAQ gets its own ``random.Random`` seeded from (seed, FAQ text),
so a FAQ's negatives do not depend on the order of the FAQs or of calls.
"""

from __future__ import annotations

import random
from collections import Counter

from medfaq.summarizer.entities import Entity, EntityRecognizer, load_recognizer, remove_overlaps, term_key
from medfaq.summarizer.entities import shared_phrases as focus_phrases

TRIES_PER_NEGATIVE = 5


def entity_hard_negatives(
    faqs: list[str],
    n_negatives: int,
    seed: int,
    recognizer: EntityRecognizer | None = None,
    entities: list[list[Entity]] | None = None,
) -> list[list[str]]:
    """ECL hard negatives: up to `n_negatives` per FAQ with its medical entities swapped for other FAQs' entities.

    `entities` (one list per FAQ) skips recognition when the caller already ran NER; otherwise `recognizer`
    (default :func:`load_recognizer`) finds them.
    """
    if entities is None:
        recognizer = recognizer or load_recognizer()
        entities = [recognizer.find(faq) for faq in faqs]
    return swap_negatives(faqs, entities, n_negatives, seed)


def focus_hard_negatives(chqs: list[str], faqs: list[str], n_negatives: int, seed: int) -> list[list[str]]:
    """QFCL hard negatives: each FAQ's focus phrases (shared with its CHQ) swapped for other FAQs' focus phrases."""
    if len(chqs) != len(faqs):
        raise ValueError(f"{len(chqs)} CHQs but {len(faqs)} FAQs")
    return swap_negatives(faqs, [focus_phrases(chq, faq) for chq, faq in zip(chqs, faqs)], n_negatives, seed)


def frame_hard_negatives(faqs: list[str], n_negatives: int, seed: int, entities: list[list[Entity]]) -> list[list[str]]:
    """Question-type hard negatives: each FAQ's frame (the words before its first entity, e.g. "What are the
    treatments for") swapped for other FAQs' frames, so the same entity is asked about in another way."""
    return swap_negatives(faqs, [question_frame(faq, spans) for faq, spans in zip(faqs, entities)], n_negatives, seed)


def question_frame(faq: str, entities: list[Entity]) -> list[Entity]:
    """The span of `faq` before its first whole-word entity, as a one-element list (empty when there is none)."""
    starts = [span.start for span in entities if is_whole_words(faq, span)]
    frame = faq[: min(starts)].rstrip() if starts else ""
    return [Entity(frame, 0, len(frame), "frame")] if frame else []


def _same_text_key(text: str) -> str:
    return " ".join(text.casefold().split())


def is_whole_words(text: str, span: Entity) -> bool:
    """True when `span` matches `text` and starts and ends at word boundaries."""
    return (
        text[span.start : span.end] == span.text
        and bool(span.text.strip())
        and (span.start == 0 or not text[span.start - 1].isalnum())
        and (span.end == len(text) or not text[span.end].isalnum())
    )


def replace_spans(text: str, spans: list[Entity], replacements: list[str]) -> str:
    """`text` with each (non-overlapping) span replaced by the replacement at the same position."""
    pieces, position = [], 0
    for span, replacement in sorted(zip(spans, replacements), key=lambda pair: pair[0].start):
        pieces += [text[position : span.start], replacement]
        position = span.end
    return "".join(pieces) + text[position:]


def term_dictionary(texts: list[str], spans: list[list[Entity]]) -> dict[str, str]:
    """D: normalised term -> its surface form, sorted by key.

    The surface form is the most frequent one; ties go to the form with fewer capitals, then alphabetically.
    """
    forms: dict[str, Counter] = {}
    for group in spans:
        for span in group:
            forms.setdefault(term_key(span.text), Counter())[span.text] += 1
    return {
        key: min(counter, key=lambda form: (-counter[form], sum(map(str.isupper, form)), form))
        for key, counter in sorted(forms.items())
        if key
    }


def swap_negatives(texts: list[str], spans: list[list[Entity]], n_negatives: int, seed: int) -> list[list[str]]:
    """One group of up to `n_negatives` negatives per text: all its spans replaced by other texts' terms."""
    if len(texts) != len(spans):
        raise ValueError(f"{len(texts)} texts but {len(spans)} span lists")
    usable = [
        remove_overlaps([span for span in group if is_whole_words(text, span) and term_key(span.text)])
        for text, group in zip(texts, spans)
    ]
    dictionary = term_dictionary(texts, usable)
    vocabulary = list(dictionary)
    groups: list[list[str]] = []
    for text, group in zip(texts, usable):
        own = {term_key(span.text) for span in group}
        negatives: list[str] = []
        if group and len(vocabulary) > len(own):
            rng = random.Random(f"{seed}\x00{text}")
            seen = {_same_text_key(text)}
            for _ in range(n_negatives * TRIES_PER_NEGATIVE):
                if len(negatives) >= n_negatives:
                    break
                replacements = [dictionary[_draw(rng, vocabulary, own)] for _ in group]
                negative = replace_spans(text, group, replacements)
                if _same_text_key(negative) not in seen:
                    seen.add(_same_text_key(negative))
                    negatives.append(negative)
        groups.append(negatives)
    return groups


def _draw(rng: random.Random, vocabulary: list[str], excluded: set[str]) -> str:
    """A uniform draw from `vocabulary` minus `excluded` (which is small and leaves at least one term)."""
    while (term := rng.choice(vocabulary)) in excluded:
        pass
    return term
