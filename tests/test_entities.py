from __future__ import annotations

import pytest

from medfaq.common.runtime import MedfaqError
from medfaq.summarizer import entities
from medfaq.summarizer.entities import DictionaryRecognizer, Entity, load_recognizer, remove_overlaps, shared_phrases


@pytest.fixture(scope="module")
def recognizer() -> DictionaryRecognizer:
    return load_recognizer("dictionary")


def test_spans_are_exact_and_labelled(recognizer):
    text = "I have fever, headache and type 2 diabetes. Can I take Aspirin or ibuprofen?"
    found = recognizer.find(text)
    assert [(e.text, e.label) for e in found] == [
        ("fever", "symptom"),
        ("headache", "symptom"),
        ("type 2 diabetes", "disease"),
        ("Aspirin", "drug"),
        ("ibuprofen", "drug"),
    ]
    assert all(text[e.start : e.end] == e.text for e in found)


def test_longest_match_whole_words_and_apostrophes(recognizer):
    text = "Is Parkinson’s disease inherited? What about heart attack risk after chemotherapy-induced nausea"
    found = {e.text for e in recognizer.find(text)}
    assert "Parkinson’s disease" in found and "heart attack" in found
    assert "disease" not in found  # the longer match wins
    assert not recognizer.find("influence of feverish thoughts on aspirinate")  # never inside a word


def test_punctuation_never_joins_words():
    recognizer = DictionaryRecognizer({"fever headache": "disease", "back pain": "symptom"})
    assert recognizer.find("fever, headache") == []
    assert recognizer.find("back. pain") == [] and recognizer.find("back (pain)") == []
    assert recognizer.find("fever   headache") == [Entity("fever   headache", 0, 16, "disease")]


def test_dictionary_skips_stopwords_and_non_disease_terms(recognizer):
    terms = recognizer.terms
    assert {"the", "can", "a"}.isdisjoint(terms)
    assert "parents" not in terms and "suggestions" not in terms  # MeSH terms outside the disease trees
    assert "abdomen, acute" not in terms and terms["acute abdomen"] == "symptom"
    assert load_recognizer("dictionary") is recognizer  # cached once


def test_remove_overlaps_prefers_longer():
    kept = remove_overlaps([Entity("a", 0, 1, "x"), Entity("a b", 0, 3, "x"), Entity("c", 4, 5, "x")])
    assert [e.text for e in kept] == ["a b", "c"]


def test_shared_phrases_are_whole_word_runs_without_stopword_edges():
    chq = "My mother has multiple myeloma. Where could she get tested, and how much does genetic testing cost?"
    faq = "Where can I get genetic testing for multiple myeloma, and what is the cost?"
    phrases = shared_phrases(chq, faq)
    assert [p.text for p in phrases] == ["get", "genetic testing", "multiple myeloma", "cost"]
    assert all(faq[p.start : p.end] == p.text and p.label == "focus" for p in phrases)
    assert shared_phrases("influenza", "What is flu?") == []


def test_stanza_backend_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(entities, "stanza_ner_models", lambda: [])
    entities._recognizer.cache_clear()
    with pytest.raises(MedfaqError, match="pip install 'medfaq\\[stanza\\]'"):
        load_recognizer("stanza")
    assert isinstance(load_recognizer("auto"), DictionaryRecognizer)
    with pytest.raises(MedfaqError, match="unknown NER backend"):
        load_recognizer("spacy")


def test_stanza_entities_are_mapped_and_overlaps_removed():
    class FakeSpan:
        def __init__(self, start, end, kind):
            self.start_char, self.end_char, self.type = start, end, kind

    class FakeDocument:
        entities = [FakeSpan(11, 18, "CHEMICAL"), FakeSpan(23, 33, "PROBLEM"), FakeSpan(23, 28, "DISEASE")]
        entities.append(FakeSpan(41, 46, "TEST"))

    recognizer = entities.StanzaRecognizer.__new__(entities.StanzaRecognizer)  # no models on disk here
    recognizer.pipeline = lambda text: FakeDocument()
    text = "Can I take aspirin for chest pain? Is an x-ray needed?"
    found = recognizer.find(text)
    # CHEMICAL -> drug, PROBLEM -> disease, the shorter overlapping "chest" dropped, TEST ignored
    assert [(e.text, e.label) for e in found] == [("aspirin", "drug"), ("chest pain", "disease")]


def test_the_dictionary_is_built_once_and_read_from_the_cache_after(monkeypatch):
    built = []
    build = entities._build_medical_dictionary
    monkeypatch.setattr(entities, "_build_medical_dictionary", lambda: built.append(1) or build())
    entities.medical_dictionary.cache_clear()
    first = entities.medical_dictionary()
    entities.medical_dictionary.cache_clear()
    assert entities.medical_dictionary() == first and len(built) == 1 and first["ibuprofen"] == "drug"
    monkeypatch.setattr(entities, "DICTIONARY_BUILD", entities.DICTIONARY_BUILD + 1)  # new rules: built again
    entities.medical_dictionary.cache_clear()
    assert entities.medical_dictionary() == first and len(built) == 2
    entities.medical_dictionary.cache_clear()
