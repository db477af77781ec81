from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from medfaq.app.cli import app
from medfaq.common.runtime import MedfaqError
from medfaq.index.concepts import CONCEPTS_FILE, ConceptLexicon, ExpandedText, concept_lexicon
from medfaq.index.faq_index import FaqIndex
from medfaq.index.records import FaqRecord

ROWS = [
    {"focus": "Menkes disease", "synonyms": ["kinky hair syndrome", "Menkes syndrome", "copper transport disease"]},
    {"focus": "Menkes disease", "synonyms": ["MNK"]},  # merged into the same concept; too short to be matched
    {"focus": "Shingles", "synonyms": ["herpes zoster", "zoster"]},
    {"focus": "Zoster", "synonyms": []},  # "zoster" now names two concepts: never matched
    {"focus": "Parkinson's disease", "synonyms": ["paralysis agitans", "disease"]},  # "disease" is too generic
]


@pytest.fixture
def lexicon():
    return ConceptLexicon.from_rows(ROWS, source="test", max_names=3)


def test_lexicon_matches_unambiguous_forms_longest_first(lexicon):
    assert lexicon.concepts[0] == [
        "Menkes disease",
        "MNK",
        "Menkes syndrome",
        "kinky hair syndrome",
        "copper transport disease",
    ]
    assert lexicon.concepts[3] == ["Parkinson's disease", "paralysis agitans"]  # the generic "disease" dropped
    assert lexicon.names_in("How is kinky hair syndrome treated?") == ["Menkes disease", "MNK", "Menkes syndrome"]
    assert lexicon.names_in("Is zoster contagious? What about MNK or a disease?") == []
    assert lexicon.names_in("shingles and paralysis agitans") == ["zoster", "herpes zoster", "Parkinson's disease"]
    assert lexicon.expand("What is herpes zoster?") == "What is herpes zoster? (Shingles; zoster)"
    assert lexicon.expand("Q: A", question="A question without concepts") == "Q: A"


def test_lexicon_saves_and_reads_jsonl(tmp_path, lexicon):
    lexicon.save(tmp_path / "c.jsonl")
    again = ConceptLexicon.load(tmp_path / "c.jsonl", lexicon.describe())
    assert again.concepts == lexicon.concepts and again.describe() == lexicon.describe()
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    assert concept_lexicon(str(rows), max_names=3).concepts == lexicon.concepts
    (tmp_path / "empty.jsonl").write_text('{"question": "no focus"}\n{"focus": 3}\n', encoding="utf-8")
    with pytest.raises(MedfaqError, match="holds no concepts"):
        concept_lexicon(str(tmp_path / "empty.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"focus": "a b c d"}\nnot json\n', encoding="utf-8")
    with pytest.raises(MedfaqError, match="bad.jsonl:2: not a JSON line"):
        concept_lexicon(str(tmp_path / "bad.jsonl"))
    string_synonyms = ConceptLexicon.from_rows([{"focus": "Gout", "synonyms": "Podagra"}])
    assert string_synonyms.concepts == [["Gout"]]  # a string is not a list of synonyms


def test_sources_auto_medquad_none_and_bad(tmp_path):
    assert concept_lexicon("none") is None
    assert concept_lexicon("auto") is None  # MEDFAQ_HOME (a fresh directory in tests) has no MedQuAD
    with pytest.raises(MedfaqError, match="medfaq data fetch medquad"):
        concept_lexicon("medquad")
    with pytest.raises(MedfaqError, match="neither auto, medquad, none nor a JSONL file"):
        concept_lexicon(str(tmp_path / "missing.jsonl"))


def test_index_encodes_a_concept_faq_with_its_synonyms(tmp_path, tiny_encoder, lexicon):
    records = [
        FaqRecord("m", "What are the treatments for kinky hair syndrome?"),
        FaqRecord("p", "Is Parkinson's disease inherited?"),
        FaqRecord("x", "How much water should I drink?"),
    ]
    index = FaqIndex.build(records, tiny_encoder, progress=False, concepts=lexicon)
    plain = tiny_encoder.encode([r.question for r in records])
    expanded = tiny_encoder.encode([lexicon.expand(r.question) for r in records[:2]])
    summed = plain[:2] + expanded
    wanted = np.vstack([summed / np.linalg.norm(summed, axis=1, keepdims=True), plain[2:]])
    for row in range(3):
        assert dict(index.search_vectors(wanted[row : row + 1], 3)[0])[records[row].id] == pytest.approx(1.0, abs=1e-5)

    index.save(tmp_path / "idx")
    assert (tmp_path / "idx" / CONCEPTS_FILE).is_file()
    loaded = FaqIndex.load(tmp_path / "idx", tiny_encoder)
    assert loaded.manifest.concepts == lexicon.describe() and CONCEPTS_FILE in loaded.manifest.checksums
    new = FaqRecord("s", "How is shingles treated?")
    loaded.editor().add([new], progress=False)  # later additions use the saved lexicon
    both = tiny_encoder.encode([new.question, lexicon.expand(new.question)]).sum(axis=0, keepdims=True)
    top = loaded.search_vectors(both / np.linalg.norm(both), 1)[0][0]
    assert top[0] == "s" and top[1] == pytest.approx(1.0, abs=1e-5)
    assert loaded.moved_to("faiss", kind="hnsw", progress=False).concepts is loaded.concepts


def test_index_build_synonyms_option(tmp_path, faq_jsonl, tiny_encoder_dir):
    rows = tmp_path / "concepts.jsonl"
    rows.write_text(json.dumps({"focus": "herpes zoster", "synonyms": ["shingles"]}) + "\n", encoding="utf-8")
    runner = CliRunner()
    out = tmp_path / "idx"
    args = ["index", "build", str(faq_jsonl), "--out", str(out), "--encoder", str(tiny_encoder_dir)]
    result = runner.invoke(app, [*args, "--synonyms", str(rows)])
    assert result.exit_code == 0, result.output
    assert "1 " in result.stderr and "concepts are also encoded with its synonyms" in result.stderr
    assert json.loads((out / "manifest.json").read_text())["concepts"]["concepts"] == 1
    bad = runner.invoke(app, [*args, "--synonyms", "umls"])
    assert bad.exit_code == 2 and bad.stderr.strip().startswith("error: --synonyms 'umls' is neither")
    plain = runner.invoke(app, [*args, "--synonyms", "none"])
    assert plain.exit_code == 0 and not (out / CONCEPTS_FILE).exists()


def test_the_reranker_reads_faqs_with_the_synonyms_they_were_encoded_with(tiny_encoder, lexicon):
    from medfaq.retriever.pipeline import Pipeline, PipelineConfig

    class RecordingReranker:
        def __init__(self):
            self.read = []

        def score(self, query, candidates):
            self.read.extend(candidates)
            return [0.0] * len(candidates)

    records = [FaqRecord("m", "How is kinky hair syndrome treated?"), FaqRecord("x", "How much water should I drink?")]
    reranker = RecordingReranker()
    index = FaqIndex.build(records, tiny_encoder, progress=False, concepts=lexicon)
    Pipeline(index, PipelineConfig(mode="dense", rerank=True), reranker=reranker).run("menkes")
    assert sorted(reranker.read) == [
        "How is kinky hair syndrome treated? (Menkes disease; MNK; Menkes syndrome)",
        "How much water should I drink?",
    ]
    assert index.text_for_reranking("plain") == "plain"
    assert FaqIndex.build(records, tiny_encoder, progress=False).text_for_reranking(records[0].question) == (
        records[0].question
    )


def test_a_correction_reranker_corrects_the_cosine_the_index_searched_with(tiny_encoder, lexicon):
    """Its bi-encoder scores an FAQ read with synonyms by the vector the index stores (written + expanded, summed),
    so the prior equals the dense score of every hit, expanded or not."""
    from medfaq.retriever.biencoder.scorer import BiEncoderScorer
    from medfaq.retriever.pipeline import Pipeline, PipelineConfig

    records = [FaqRecord("m", "How is kinky hair syndrome treated?"), FaqRecord("x", "How much water should I drink?")]
    index = FaqIndex.build(records, tiny_encoder, progress=False, concepts=lexicon)
    query = "menkes treatment"
    hits = Pipeline(index, PipelineConfig(mode="dense", rerank=False, abstain=False)).run(query).hits
    texts = [index.text_for_reranking(hit.question) for hit in hits]
    assert [text.written for text in texts if isinstance(text, ExpandedText)] == [records[0].question]
    prior = BiEncoderScorer(tiny_encoder.model).score_pairs([(query, text) for text in texts])
    np.testing.assert_allclose(prior, [hit.score for hit in hits], atol=1e-5)
    as_read = BiEncoderScorer(tiny_encoder.model).score_pairs([(query, str(text)) for text in texts])
    assert not np.allclose(as_read, prior)  # the expanded text alone is another vector


def test_reranker_training_pairs_read_faqs_as_a_synonym_index_shows_them(lexicon):
    from medfaq.retriever.training.config import make_config
    from medfaq.retriever.training.pair_data import Pair, with_concepts

    pairs = [Pair("menkes?", "How is kinky hair syndrome treated?", 1, "g"), Pair("menkes?", "Is water safe?", 0, "g")]
    read = with_concepts(pairs, lexicon)
    assert [pair.text_a for pair in read] == ["menkes?", "menkes?"]  # queries stay as written
    assert isinstance(read[0].text_b, ExpandedText) and read[0].text_b.written == pairs[0].text_b
    assert read[0].text_b.startswith(pairs[0].text_b + " (Menkes disease")
    assert read[1] == pairs[1] and with_concepts(pairs, None) == pairs
    with pytest.raises(MedfaqError, match="needs --task faq"):
        make_config("crossencoder", "mqp", "quick", faq_synonyms="medquad")


def test_train_synonyms_option_errors(tmp_path):
    runner = CliRunner()
    args = ["train", "crossencoder", "--out", str(tmp_path / "m")]
    wrong_task = runner.invoke(app, [*args, "--task", "mqp", "--synonyms", "medquad"])
    assert wrong_task.exit_code == 2 and "needs --task faq" in wrong_task.stderr
    missing = runner.invoke(app, [*args, "--task", "faq", "--synonyms", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2 and "is neither auto, medquad, none nor a JSONL file" in missing.stderr
    assert not (tmp_path / "m").exists()
