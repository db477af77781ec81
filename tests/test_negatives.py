from __future__ import annotations

import re

from medfaq.summarizer.entities import DictionaryRecognizer, Entity, term_key
from medfaq.summarizer.training.negatives import (
    entity_hard_negatives,
    focus_hard_negatives,
    frame_hard_negatives,
    swap_negatives,
)

TERMS = {
    "flu": "disease",
    "asthma": "disease",
    "aspirin": "drug",
    "ibuprofen": "drug",
    "migraine": "disease",
    "metformin": "drug",
    "type 2 diabetes": "disease",
}
FAQS = [
    "Does the flu have any influence on asthma?",
    "Can I take Aspirin for a migraine?",
    "Is metformin used for type 2 diabetes?",
    "What is the FLU?",
    "How do I stop snoring?",
]


def recognizer() -> DictionaryRecognizer:
    return DictionaryRecognizer(TERMS)


def normalised(text: str) -> str:
    return " ".join(text.casefold().split())


def outside_entities(text: str) -> list[str]:
    """The text between the recognised entities (what a negative must keep unchanged)."""
    found = recognizer().find(text)
    bounds = [0] + [b for e in found for b in (e.start, e.end)] + [len(text)]
    return [text[bounds[i] : bounds[i + 1]] for i in range(0, len(bounds), 2)]


def test_groups_belong_to_their_own_faq_and_never_equal_it():
    groups = entity_hard_negatives(FAQS, 3, seed=0, recognizer=recognizer())
    assert len(groups) == len(FAQS)
    assert groups[-1] == []  # no entity, no negative
    for faq, group in zip(FAQS, groups):
        own = {term_key(e.text) for e in recognizer().find(faq)}
        assert len(group) <= 3 and len(set(map(normalised, group))) == len(group)
        for negative in group:
            assert normalised(negative) != normalised(faq)
            # negative i differs from FAQ i only inside entity spans: same text around them, same order
            pattern = "(.+?)".join(re.escape(piece) for piece in outside_entities(faq))
            match = re.fullmatch(pattern, negative)
            assert match, (faq, negative)
            assert all(term_key(swapped) in set(map(term_key, TERMS)) - own for swapped in match.groups())
    assert len(groups[0]) == 3 and len(groups[2]) == 3


def test_whole_words_only():
    groups = entity_hard_negatives(FAQS, 4, seed=1, recognizer=recognizer())
    assert all(negative.startswith("Does the ") and " any influence on " in negative for negative in groups[0])
    # a recogniser that reports a span inside a word is ignored rather than trusted
    inside_word = [[Entity("flu", 26, 29, "disease")], [Entity("asthma", 0, 6, "disease")]]
    texts = ["Does the cold have any influence?", "asthma"]
    assert swap_negatives(texts, inside_word, 2, seed=0)[0] == []


def test_dictionary_excludes_the_faqs_own_entities_case_insensitively():
    faqs = ["Is flu worse than FLU?", "Is Flu contagious?", "Is asthma chronic?", "Does Flu spread?"]
    groups = entity_hard_negatives(faqs, 5, seed=0, recognizer=recognizer())
    # D = {flu, asthma}: FAQs 0, 1 and 3 can only get asthma, FAQ 2 only flu (in its most frequent surface form)
    assert groups[0] == ["Is asthma worse than asthma?"] and groups[1] == ["Is asthma contagious?"]
    assert groups[2] == ["Is Flu chronic?"] and groups[3] == ["Does asthma spread?"]
    assert entity_hard_negatives(["Is flu bad?", "Is FLU bad?"], 3, seed=0, recognizer=recognizer()) == [[], []]


def test_reproducible_with_a_seed_and_independent_of_order():
    first = entity_hard_negatives(FAQS, 3, seed=7, recognizer=recognizer())
    assert first == entity_hard_negatives(FAQS, 3, seed=7, recognizer=recognizer())
    assert first != entity_hard_negatives(FAQS, 3, seed=8, recognizer=recognizer())
    assert entity_hard_negatives(FAQS[::-1], 3, seed=7, recognizer=recognizer())[::-1] == first


def test_precomputed_entities_skip_recognition():
    found = [recognizer().find(faq) for faq in FAQS]
    assert entity_hard_negatives(FAQS, 2, seed=3, entities=found) == entity_hard_negatives(
        FAQS, 2, seed=3, recognizer=recognizer()
    )


def test_focus_negatives_swap_shared_phrases():
    chqs = [
        "I keep waking up with a migraine headache, what helps?",
        "My son has asthma attacks at night. Is an inhaler enough?",
        "Grandma takes metformin daily. Any interactions with aspirin?",
    ]
    faqs = [
        "How can I treat a migraine headache?",
        "How are nighttime asthma attacks treated?",
        "Does metformin interact?",
    ]
    groups = focus_hard_negatives(chqs, faqs, 2, seed=0)
    assert len(groups) == 3
    assert groups[0] and all(g.startswith("How can I treat a ") and "migraine headache" not in g for g in groups[0])
    assert all(normalised(g) != normalised(f) for f, group in zip(faqs, groups) for g in group)
    assert groups == focus_hard_negatives(chqs, faqs, 2, seed=0)


def test_frame_negatives_ask_about_the_same_entity_in_another_way():
    faqs = ["What are the treatments for asthma?", "Who makes aspirin?", "Is metformin safe?", "Flu: how long?"]
    found = [recognizer().find(faq) for faq in faqs]
    groups = frame_hard_negatives(faqs, 2, seed=0, entities=found)
    frames = {"What are the treatments for", "Who makes", "Is"}
    for faq, group, entities in zip(faqs[:3], groups, found):
        own = faq[: entities[0].start].rstrip()
        assert len(group) == 2 and all(normalised(g) != normalised(faq) for g in group)
        for negative in group:
            frame = next(f for f in frames if negative.startswith(f + " "))
            assert frame != own and negative == frame + faq[entities[0].start - 1 :]
    assert groups[3] == []  # the entity opens the FAQ: no frame to swap
    assert groups == frame_hard_negatives(faqs, 2, seed=0, entities=found)
