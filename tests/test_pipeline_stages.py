"""The pipeline with fake stages: summary/entities/rerank/filter/abstain, the unanswered log, config and threads."""

from __future__ import annotations

import ast
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from medfaq.common.runtime import MedfaqError
from medfaq.index.faq_index import FaqIndex
from medfaq.retriever.model_cache import build_pipeline
from medfaq.retriever.pipeline import Pipeline, PipelineConfig, confidence, key_stems
from medfaq.retriever.pipeline_file import read_config, store_threshold, write_config
from medfaq.retriever.queue.unanswered import UnansweredLog


@pytest.fixture(scope="module")
def index(tiny_encoder):
    from medfaq.index.records import FaqRecord
    from tests.conftest import FAQ_ROWS

    return FaqIndex.build([FaqRecord.from_dict(row) for row in FAQ_ROWS], tiny_encoder, progress=False)


class KeywordSummary:
    """'summarizes' a question to the FAQ-like phrase of the first keyword it contains."""

    PHRASES = {"shingles": "How is shingles treated?", "migraine": "What causes migraine headaches?"}

    def rewrite(self, texts):
        return [next((p for k, p in self.PHRASES.items() if k in t.lower()), t) for t in texts]


class CountingReranker:
    """The fraction of the query's words found in the candidate; remembers how many candidates it scored."""

    def __init__(self):
        self.sizes = []

    def score(self, query, candidates):
        self.sizes.append(len(candidates))
        words = set(query.lower().replace("?", "").split())
        return [len(words & set(c.lower().replace("?", "").split())) / len(words) for c in candidates]


@dataclass(frozen=True)
class FakeEntity:
    text: str
    start: int
    end: int
    label: str


class WordEntities:
    WORDS = ("shingles", "migraine", "amoxicillin", "diabetes")

    def find(self, text):
        lower = text.lower()
        return [FakeEntity(w, lower.index(w), lower.index(w) + len(w), "disease") for w in self.WORDS if w in lower]


def test_stages_run_in_order_and_report(index):
    reranker = CountingReranker()
    config = PipelineConfig(
        mode="bm25",
        top_k=2,
        summarize=True,
        query_source="summary",
        rerank=True,
        rerank_depth=3,
        rerank_fusion="replace",
        candidates=5,
    )
    pipeline = Pipeline(index, config, rewriter=KeywordSummary(), reranker=reranker, entity_finder=WordEntities())
    question = "my neighbour has a painful rash, they said shingles. what do doctors do?"
    response = pipeline.run(question)
    assert response.summary == "How is shingles treated?"
    assert [e.text for e in response.entities] == ["shingles"]
    assert response.hits[0].id == "f3"
    assert set(response.hits[0].stage_scores) == {"bm25", "rerank"}
    assert response.confidence == response.hits[0].stage_scores["rerank"] == 1.0
    assert set(response.timings_ms) == {"rewrite", "entities", "retrieve", "rerank", "total"}
    assert all(size <= 3 for size in reranker.sizes)  # only the top `rerank_depth` are rescored
    data = response.to_dict()
    start = question.index("shingles")
    assert data["entities"][0] == {"text": "shingles", "start": start, "end": start + 8, "label": "disease"}


def test_raw_and_summary_fusion_keeps_both_stage_scores(index):
    config = PipelineConfig(mode="dense", top_k=6, summarize=True, query_source="both")
    response = Pipeline(index, config, rewriter=KeywordSummary()).run("migraine since monday, why?")
    assert all("fusion" in hit.stage_scores for hit in response.hits)
    assert any("summary_dense" in hit.stage_scores for hit in response.hits)
    assert any("dense" in hit.stage_scores for hit in response.hits)
    top = response.hits[0].stage_scores
    assert confidence(response.hits) == max(v for k, v in top.items() if k.endswith("dense"))


class ReverseReranker:
    """Scores candidates in the reverse of the order it is given them, and records the queries it reads."""

    def __init__(self):
        self.queries = []

    def score(self, query, candidates):
        self.queries.append(query)
        return [float(position) for position in range(len(candidates))]


def test_rrf_rerank_fusion_combines_retrieval_and_reranker_ranks(index):
    question = "treatment of shingles rash"
    retrieved = [h.id for h in Pipeline(index, PipelineConfig(mode="dense", top_k=5)).run(question).hits]
    replace = PipelineConfig(mode="dense", top_k=5, rerank=True, rerank_depth=5, rerank_fusion="replace")
    by_model = Pipeline(index, replace, reranker=ReverseReranker()).run(question).hits
    assert [h.id for h in by_model] == retrieved[::-1]
    rrf = replace.updated(rerank_fusion="rrf", rerank_retrieval_weight=1.0, rerank_rrf_k=60)
    fused = Pipeline(index, rrf, reranker=ReverseReranker()).run(question).hits
    # every hit gets 1/(k + r) + 1/(k + 6 - r): the ends (r = 1, 5) tie above the middle, ties keep retrieval order
    assert [h.id for h in fused] == [retrieved[0], retrieved[4], retrieved[1], retrieved[3], retrieved[2]]
    assert [h.rank for h in fused] == [1, 2, 3, 4, 5]
    assert [h.stage_scores["rerank"] for h in fused[:2]] == [0.0, 4.0]
    assert fused[0].score == fused[0].stage_scores["rerank_rrf"]
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 65)
    # weighing the retrieval ranking 1.5: 1.5/(k + r) + 1/(k + 6 - r) falls with r, so a reranker that reverses
    # five hits leaves their order, and the top hit scores 1.5/61 + 1/65
    weighted = Pipeline(index, rrf.updated(rerank_retrieval_weight=1.5), reranker=ReverseReranker()).run(question)
    assert [h.id for h in weighted.hits] == retrieved
    assert weighted.hits[0].score == pytest.approx(1.5 / 61 + 1 / 65)
    # the default (w = 3, k = 10) leaves that order too, and the hybrid RRF keeps its own k
    default = PipelineConfig(mode="dense", top_k=5, rerank=True, rerank_depth=5)
    assert (default.rerank_retrieval_weight, default.rerank_rrf_k, default.rrf_k) == (3.0, 10, 60)
    by_default = Pipeline(index, default, reranker=ReverseReranker()).run(question).hits
    assert [h.id for h in by_default] == retrieved
    assert by_default[0].score == pytest.approx(3 / 11 + 1 / 15)
    with pytest.raises(MedfaqError, match="rerank fusion"):
        replace.updated(rerank_fusion="mean")
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(MedfaqError, match="rerank_retrieval_weight|finite"):
            replace.updated(rerank_retrieval_weight=bad)
    for bad in (-1, 2.5, True):
        with pytest.raises(MedfaqError, match="rerank_rrf_k must be a whole number of at least 0"):
            replace.updated(rerank_rrf_k=bad)


def test_a_rerank_margin_reranks_only_questions_whose_top_two_cosines_are_close(index):
    question = "treatment of shingles rash"
    retrieved = Pipeline(index, PipelineConfig(mode="dense", top_k=5)).run(question).hits
    margin = retrieved[0].score - retrieved[1].score
    assert margin > 0
    replace = PipelineConfig(mode="dense", top_k=5, rerank=True, rerank_depth=5, rerank_fusion="replace")
    for gate, reranked in ((margin / 2, False), (margin * 2, True), (None, True)):
        counting = CountingReranker()
        response = Pipeline(index, replace.updated(rerank_margin=gate), reranker=counting).run(question)
        assert counting.sizes == [5 if reranked else 1]  # a sure question: only its top hit is scored
        assert response.hits[0].stage_scores["rerank"] == response.confidence  # the scale of every rerank run
        if not reranked:  # the dense order and cosines stand
            assert [(h.id, h.score) for h in response.hits] == [(h.id, h.score) for h in retrieved]
    hybrid = replace.updated(mode="hybrid", rerank_margin=0.0)  # RRF scores are no cosines: every question reranked
    counting = CountingReranker()
    Pipeline(index, hybrid, reranker=counting).run(question)
    assert counting.sizes == [5]
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(MedfaqError, match="rerank_margin must be a finite number of at least 0"):
            replace.updated(rerank_margin=bad)


class CorrectingReranker(ReverseReranker):
    """A reranker whose scores already contain the first stage's (trained with a prior)."""

    corrects_first_stage = True


def test_auto_rerank_fusion_replaces_for_a_reranker_that_corrects_the_first_stage_else_fuses(index):
    question = "treatment of shingles rash"
    assert PipelineConfig().rerank_fusion == "rrf"  # the default: it lowered Recall@1 least (docs/results.md)
    config = PipelineConfig(mode="dense", top_k=5, rerank=True, rerank_depth=5, rerank_fusion="auto")
    for reranker, fusion in ((ReverseReranker(), "rrf"), (CorrectingReranker(), "replace")):
        auto = [h.id for h in Pipeline(index, config, reranker=reranker).run(question).hits]
        chosen = [
            h.id for h in Pipeline(index, config.updated(rerank_fusion=fusion), reranker=reranker).run(question).hits
        ]
        assert auto == chosen


@pytest.mark.parametrize(("source", "reads"), [("summary", "summary"), ("both", "raw"), ("raw", "raw")])
def test_auto_rerank_query_reads_the_summary_only_when_the_search_used_it_alone(index, source, reads):
    question = "my neighbour has a painful rash, they said shingles. what do doctors do?"
    reranker = ReverseReranker()
    config = PipelineConfig(mode="bm25", summarize=source != "raw", query_source=source, rerank=True)
    response = Pipeline(index, config, rewriter=KeywordSummary(), reranker=reranker).run(question)
    assert reranker.queries == [response.summary if reads == "summary" else question]


def test_key_term_filter_prefers_precision(index):
    loose = Pipeline(index, PipelineConfig(mode="dense", top_k=6)).run("treatment of shingles")
    strict = Pipeline(index, PipelineConfig(mode="dense", top_k=6, key_terms=True), entity_finder=WordEntities())
    response = strict.run("treatment of shingles")
    assert len(loose.hits) == 6
    assert [h.id for h in response.hits] == ["f3"]
    assert response.hits[0].stage_scores["overlap"] == 1.0 and response.hits[0].rank == 1
    assert key_stems(["Diabetic diabetes"]) == {"diabe"}


def test_abstention_logs_unanswered_questions(index, tmp_path):
    log = UnansweredLog(tmp_path / "unanswered.jsonl")
    config = PipelineConfig(mode="bm25", rerank=True, abstain=True, threshold=0.5)
    pipeline = Pipeline(index, config, reranker=CountingReranker(), entity_finder=WordEntities(), unanswered=log)
    answered, unanswered = pipeline.run_batch(["How is shingles treated?", "shingles vaccine price in Ohio"])
    assert not answered.abstained and unanswered.abstained
    assert unanswered.hits  # abstaining keeps the hits for the caller to show or hide
    entries = log.read()
    assert len(entries) == 1
    entry = entries[0]
    assert entry["query"] == "shingles vaccine price in Ohio" and entry["best_score"] == pytest.approx(0.2)
    assert entry["entities"] == [{"text": "shingles", "start": 0, "end": 8, "label": "disease"}]
    assert {"time", "summary", "best_id", "best_question"} <= set(entry)
    quiet = Pipeline(
        index, PipelineConfig(**{**config.to_dict(), "log_unanswered": False}), reranker=CountingReranker()
    )
    quiet.unanswered = log
    assert quiet.run("shingles vaccine price in Ohio").abstained and len(log.read()) == 1


def test_default_unanswered_log_lives_in_medfaq_home(index):
    from medfaq.common.runtime import medfaq_home

    pipeline = Pipeline(index, PipelineConfig(mode="dense", abstain=True, threshold=2.0))
    assert pipeline.run("anything at all").abstained
    assert json.loads((medfaq_home() / "unanswered.jsonl").read_text().splitlines()[0])["query"] == "anything at all"


def test_config_round_trip_and_flag_overrides(tmp_path):
    config = PipelineConfig(mode="bm25", summarize=True, query_source="both", rerank=True, rerank_depth=7)
    write_config(tmp_path, config)
    loaded = read_config(tmp_path)
    assert loaded == config
    assert loaded.with_flags(summarize=False).query_source == "raw"
    assert loaded.with_flags(rerank=False, mode="dense").to_dict() == {
        **config.to_dict(),
        "rerank": False,
        "mode": "dense",
    }
    plain = PipelineConfig()
    assert plain.with_flags(summarize=True).query_source == "both"  # the question and its summary fused
    assert plain.with_flags(query_source="both").summarize is True
    assert plain.with_flags(summarize=None, rerank=None) == plain
    with pytest.raises(MedfaqError, match="unknown rerank query"):
        plain.updated(rerank_query="nope")
    with pytest.raises(MedfaqError, match="at least 1"):
        plain.updated(rerank_depth=0)


def test_concurrent_searches_equal_serial_ones(index):
    config = PipelineConfig(mode="hybrid", top_k=4, summarize=True, query_source="both", rerank=True)
    stages = {"rewriter": KeywordSummary(), "reranker": CountingReranker(), "entity_finder": WordEntities()}
    pipeline = Pipeline(index, config, **stages)
    per_request = Pipeline(index, config, **stages)  # a second pipeline around the same stage objects
    words = ["shingles", "migraine", "diabetes", "measles", "amoxicillin", "parkinson", "rash", "vaccine", "cough", "x"]
    queries = [f"question {i} about {words[i % len(words)]} and {words[(3 * i) % len(words)]}" for i in range(20)]

    def ranked(response):
        return [(h.id, h.rank, round(h.score, 6), sorted(h.stage_scores)) for h in response.hits], response.summary

    serial = [ranked(pipeline.run(q)) for q in queries]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for _ in range(4):
            assert list(pool.map(lambda q: ranked(pipeline.run(q)), queries)) == serial
        both = pool.map(lambda i: ranked((pipeline, per_request)[i % 2].run(queries[i])), range(len(queries)))
        assert list(both) == serial


def test_real_stage_loaders_are_registered_and_pass_settings(monkeypatch, index):
    import torch

    import medfaq.summarizer.generation as generation
    from medfaq.common.runtime import models_dir, quantize_linear
    from medfaq.retriever.model_cache import _STAGE_LOADERS
    from medfaq.summarizer.decoding import Decoding

    assert {"rewrite", "rerank", "entities"} <= set(_STAGE_LOADERS)

    class FakeSummarizer:
        def __init__(self, quantize):
            self.model = torch.nn.Sequential(torch.nn.Linear(4, 4))
            if quantize:
                quantize_linear(self.model)
            self.calls = []
            self.decoding = Decoding(max_length=32)

        @classmethod
        def load(cls, name, device=None, quantize=False):
            assert Path(name).name == "summarizer-ecl-quick"  # the best (only) summarizer on disk
            return cls(quantize)

        def summarize(self, texts, decoding):
            self.calls.append((decoding.num_beams, decoding.max_length))
            return [t.upper() for t in texts]

    monkeypatch.setattr(generation, "Summarizer", FakeSummarizer)
    trained = models_dir() / "summarizer-ecl-quick"
    trained.mkdir(parents=True)
    (trained / "config.json").write_text("{}", encoding="utf-8")
    config = PipelineConfig(summarize=True, summary_beams=4, summary_max_length=20, quantize=True, entities=False)
    pipeline = build_pipeline(index, config)
    assert pipeline.run("shingles?").summary == "SHINGLES?"
    assert pipeline.rewriter.summarizer.calls == [(4, 20)]
    greedy = build_pipeline(index, PipelineConfig(summarize=True, entities=False))
    greedy.run("shingles?")
    assert greedy.rewriter.summarizer.calls == [(1, 32)]  # the model's validated settings
    assert "quantized" in type(pipeline.rewriter.summarizer.model[0]).__module__  # int8 dynamic Linear


def test_confidence_is_the_top_hits_score_of_the_last_scoring_stage(index):
    dense = Pipeline(index, PipelineConfig(mode="dense", top_k=5, entities=False)).run("shingles treatment")
    assert dense.confidence == dense.hits[0].stage_scores["dense"]
    assert dense.confidence >= dense.hits[1].stage_scores["dense"]
    bm25 = Pipeline(index, PipelineConfig(mode="bm25", entities=False)).run("shingles treatment")
    assert bm25.confidence == bm25.hits[0].stage_scores["bm25"]
    config = PipelineConfig(mode="hybrid", rerank=True, rerank_fusion="rrf", entities=False)
    reranked = Pipeline(index, config, reranker=CountingReranker()).run("How is shingles treated?")
    assert reranked.confidence == reranked.hits[0].stage_scores["rerank"]


def test_each_configuration_uses_its_own_threshold(index):
    thresholds = {"dense@raw": 2.0, "bm25+rerank@raw": -1.0}
    base = PipelineConfig(top_k=3, entities=False, log_unanswered=False, thresholds=thresholds)
    assert base.abstain  # on by default, effective where a threshold was calibrated
    dense = base.updated(mode="dense")
    assert dense.threshold_key == "dense@raw" and dense.active_threshold() == 2.0
    assert Pipeline(index, dense).run("shingles").abstained
    hybrid = base.updated(mode="hybrid")  # never calibrated: judged on dense search's threshold
    assert hybrid.abstention_key() == "dense@raw" and hybrid.active_threshold() == 2.0
    assert Pipeline(index, hybrid).run("shingles").abstained
    own = hybrid.updated(thresholds={**thresholds, "hybrid@raw": -1.0})  # its own, where one was calibrated
    assert own.abstention_key() == "hybrid@raw" and not Pipeline(index, own).run("shingles").abstained
    reranked = base.updated(mode="bm25", rerank=True)
    assert not Pipeline(index, reranked, reranker=CountingReranker()).run("shingles").abstained
    override = dense.updated(threshold=-5.0)  # --threshold on the command line applies to whatever runs
    assert override.active_threshold() == -5.0 and not Pipeline(index, override).run("shingles").abstained


@pytest.mark.parametrize("mode", ["bm25", "hybrid"])
def test_bm25_and_hybrid_search_abstain_by_their_top_faqs_cosine_below_the_dense_threshold(index, mode):
    """A mode never calibrated judges its final top FAQ by its dense cosine with the question (scored where its own
    search did not) against dense search's threshold: the exact FAQ question is answered, an off-topic question
    sharing one of its words is not."""
    on_topic, off_topic = "How is shingles treated?", "which shingles suit a garden shed roof in the rain"
    config = PipelineConfig(mode=mode, entities=False, log_unanswered=False, abstain=False)
    tops = {question: Pipeline(index, config).run(question).hits[0].id for question in (on_topic, off_topic)}
    cosine = {question: index.search_dense([question], 1, [faq])[0][0][1] for question, faq in tops.items()}
    assert cosine[on_topic] > cosine[off_topic]
    calibrated = config.updated(abstain=True, thresholds={"dense@raw": (cosine[on_topic] + cosine[off_topic]) / 2})
    pipeline = Pipeline(index, calibrated)
    for question, abstained in ((on_topic, False), (off_topic, True)):
        response = pipeline.run(question)
        assert response.abstained is abstained and response.hits[0].id == tops[question]
        assert response.confidence == pytest.approx(cosine[question], abs=1e-5)


def test_a_configuration_without_any_threshold_says_once_that_abstention_is_off(tmp_path, index, caplog):
    FaqIndex.build(index.records(), index.encoder, progress=False).save(tmp_path / "idx")
    saved = FaqIndex.load(tmp_path / "idx", encoder=index.encoder)
    config = PipelineConfig(mode="hybrid", entities=False, log_unanswered=False)
    for _ in range(2):
        Pipeline(saved, config).run("shingles")
    said = [record.getMessage() for record in caplog.records if "abstention is off" in record.getMessage()]
    assert said == [
        f"abstention is off: {tmp_path / 'idx'} has no threshold for hybrid@raw nor dense@raw, so every question "
        "with a hit is answered (calibrate one with `medfaq eval retrieval --save-threshold`)"
    ]


def test_old_one_threshold_pipeline_json_still_loads(tmp_path):
    old = {"mode": "dense", "rerank": True, "abstain": True, "threshold": 0.7, "top_k": 4}
    (tmp_path / "pipeline.json").write_text(json.dumps(old), encoding="utf-8")
    config = read_config(tmp_path)
    assert config.threshold is None and config.thresholds == {"dense+rerank@raw": 0.7}
    assert config.updated(rerank=False).active_threshold() is None
    never_calibrated = {**old, "abstain": False, "threshold": 0.5}
    (tmp_path / "pipeline.json").write_text(json.dumps(never_calibrated), encoding="utf-8")
    assert read_config(tmp_path).thresholds == {}
    saved_before_rerank_rrf_k = {**old, "rerank_retrieval_weight": 1.5, "rrf_k": 60}  # keeps the fusion it had
    (tmp_path / "pipeline.json").write_text(json.dumps(saved_before_rerank_rrf_k), encoding="utf-8")
    loaded = read_config(tmp_path)
    assert (loaded.rerank_retrieval_weight, loaded.rerank_rrf_k) == (1.5, 60)
    (tmp_path / "pipeline.json").write_text(json.dumps({**old, "rerank_retrieval_weight": 0}), encoding="utf-8")
    with pytest.raises(MedfaqError, match=r"pipeline.json is not a valid pipeline config: .*rerank_retrieval_weight"):
        read_config(tmp_path)  # a bad value names the file it came from


def test_store_threshold_keeps_other_configurations(tmp_path):
    write_config(tmp_path, PipelineConfig(mode="bm25", top_k=3, thresholds={"bm25@raw": 4.0}))
    store_threshold(tmp_path, PipelineConfig(mode="dense"), 0.42)
    saved = read_config(tmp_path)
    assert saved.mode == "bm25" and saved.top_k == 3 and saved.abstain
    assert saved.thresholds == {"bm25@raw": 4.0, "dense@raw": 0.42}


def test_weighted_hybrid_fusion_follows_the_dense_list(index):
    heavy = Pipeline(index, PipelineConfig(mode="hybrid", top_k=6, dense_weight=1000.0, entities=False))
    dense = Pipeline(index, PipelineConfig(mode="dense", top_k=6, entities=False)).run("shingles vaccine")
    fused = heavy.run("shingles vaccine").hits
    assert [h.id for h in fused][:3] == [h.id for h in dense.hits][:3] and "rrf" in fused[0].stage_scores
    with pytest.raises(MedfaqError, match="dense_weight"):
        PipelineConfig(dense_weight=0)


def test_a_missing_set_up_model_names_the_fix(index):
    for config, model in (
        (PipelineConfig(summarize=True, entities=False), "summarizer-ecl-quick"),
        (PipelineConfig(rerank=True, entities=False), "reranker-correction-quick"),
    ):
        with pytest.raises(MedfaqError) as error:
            build_pipeline(index, config)
        message = str(error.value)
        assert "\n" not in message and "`medfaq setup --all`" in message
        assert f"`medfaq setup --model {model}`" in message


def _names_the_pipeline_file(node: object) -> bool:
    if isinstance(node, ast.Name | ast.alias):
        return "PIPELINE_FILE" in (getattr(node, "id", None), getattr(node, "name", None))
    return isinstance(node, ast.Constant) and node.value == "pipeline.json"


def test_pipeline_json_is_read_and_written_in_one_module():
    """Every other module asks retriever.pipeline_file: none names the file, and PipelineConfig has no file methods."""
    from tests.test_layering import module_files

    naming = sorted(
        name
        for name, path in module_files().items()
        if name != "medfaq.retriever.pipeline_file"
        and any(map(_names_the_pipeline_file, ast.walk(ast.parse(path.read_text(encoding="utf-8")))))
    )
    assert naming == []
    assert not any(hasattr(PipelineConfig, method) for method in ("load", "save", "parse"))
