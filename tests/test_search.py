from __future__ import annotations

import json
import logging
from dataclasses import asdict

import pytest

from medfaq.app.options import StageFlags
from medfaq.common.runtime import MedfaqError
from medfaq.index.faq_index import FaqIndex
from medfaq.retriever.model_cache import build_pipeline, register_stage_loader
from medfaq.retriever.pipeline import Pipeline, PipelineConfig, SearchResponse
from medfaq.retriever.pipeline_file import read_config, store_threshold, write_config
from medfaq.retriever.search import Retriever, clean_queries, reciprocal_rank_fusion
from medfaq.retriever.stages import STAGES
from medfaq.retriever.stages.rerank import RerankSettings


@pytest.fixture
def index(faq_records, tiny_encoder):
    return FaqIndex.build(faq_records, tiny_encoder, progress=False)


def test_rrf_uses_k_60_and_ranks_from_one():
    fused = dict(reciprocal_rank_fusion([[("a", 9.0), ("b", 1.0)], [("b", 5.0)]]))
    assert fused["a"] == pytest.approx(1 / 61)
    assert fused["b"] == pytest.approx(1 / 62 + 1 / 61)


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_modes_return_ranked_hits_with_stage_scores(index, mode):
    hits = Retriever(index, mode).search_one("Can I drink alcohol while taking amoxicillin?", top_k=3)
    assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
    assert hits[0].id == "f1" and hits[0].question.startswith("Can I drink")
    expected = {"dense": {"dense"}, "bm25": {"bm25"}, "hybrid": {"dense", "bm25", "rrf"}}[mode]
    assert set(hits[0].stage_scores) == expected
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))


def test_batch_and_beir_search(index):
    retriever = Retriever(index, "bm25")
    batch = retriever.search(["shingles treatment", "diabetes symptoms"], top_k=2)
    assert [row[0].id for row in batch] == ["f3", "f2"]
    run = retriever.beir_search({"q1": "shingles treatment", "q2": "migraine causes"}, top_k=1)
    assert list(run) == ["q1", "q2"] and list(run["q2"]) == ["f5"]


def test_bad_queries(index, caplog):
    with pytest.raises(MedfaqError, match="empty query"):
        Retriever(index).search_one("   \n")
    with pytest.raises(MedfaqError, match="unknown search mode"):
        Retriever(index, "fuzzy")
    with pytest.raises(MedfaqError, match="top-k"):
        Retriever(index).search_one("flu", top_k=0)
    with pytest.raises(MedfaqError, match=r"query 2 is not valid UTF-8 \(byte 0xe9 at character 4\)"):
        Retriever(index, "bm25").search(["flu", "caf\udce9"])
    with pytest.raises(MedfaqError, match=r"query is not valid UTF-8 \(\\ud800 at character 3\)"):
        clean_queries([" a\ud800"])
    with caplog.at_level(logging.WARNING, logger="medfaq"):
        assert clean_queries(["x" * 50], max_chars=10) == ["x" * 10]
    assert "truncated to 10" in caplog.text


class Shorten:
    def rewrite(self, texts):
        return ["shingles treatment" for _ in texts]


class PreferMigraine:
    def score(self, query, candidates):
        return [1.0 if "migraine" in c else 0.1 for c in candidates]


def test_pipeline_without_stages_is_plain_retrieval(index):
    response = Pipeline(index, PipelineConfig(mode="bm25", top_k=2)).run("How is shingles treated?")
    assert isinstance(response, SearchResponse)
    assert response.summary is None and not response.abstained
    assert [h.id for h in response.hits][:1] == ["f3"]
    assert {"retrieve", "total"} <= set(response.timings_ms)


def test_pipeline_runs_rewrite_and_rerank_stages(index):
    config = PipelineConfig(
        mode="hybrid", top_k=2, summarize=True, query_source="summary", rerank=True, rerank_fusion="replace"
    )
    response = Pipeline(index, config, rewriter=Shorten(), reranker=PreferMigraine()).run("long messy story ...")
    assert response.summary == "shingles treatment"
    assert response.hits[0].id == "f5" and response.hits[0].stage_scores["rerank"] == 1.0
    assert set(response.timings_ms) == {"rewrite", "retrieve", "rerank", "total"}
    both = PipelineConfig(mode="bm25", summarize=True, query_source="both")
    fused = Pipeline(index, both, rewriter=Shorten()).run("what causes migraine")
    assert {"f3", "f5"} <= {h.id for h in fused.hits}


def test_abstain_uses_threshold(index):
    sure = Pipeline(index, PipelineConfig(rerank=True, abstain=True, threshold=0.5), reranker=PreferMigraine())
    assert not sure.run("migraine").abstained
    unsure = Pipeline(index, PipelineConfig(rerank=True, abstain=True, threshold=2.0), reranker=PreferMigraine())
    assert unsure.run("migraine").abstained


def test_pipeline_config_round_trip_and_validation(tmp_path, index):
    config = PipelineConfig(mode="dense", top_k=3, abstain=True, threshold=0.3)
    write_config(tmp_path, config)
    assert read_config(tmp_path) == config
    assert read_config(tmp_path / "none") == PipelineConfig()
    with pytest.raises(MedfaqError, match="unknown pipeline setting"):
        PipelineConfig.from_dict({"modes": "dense"})
    with pytest.raises(MedfaqError, match="needs summarize"):
        PipelineConfig(query_source="summary")
    with pytest.raises(MedfaqError, match="no rewrite stage was given"):
        Pipeline(index, PipelineConfig(summarize=True))
    with pytest.raises(MedfaqError, match="rerank_max_length must be a whole number of at least 8"):
        PipelineConfig(rerank_max_length=4)
    at_fault = "^top_k must be a whole number of at least 1 and at most 100, got 0$"  # the one at fault
    with pytest.raises(MedfaqError, match=at_fault):
        PipelineConfig(top_k=0)
    flags = StageFlags(rerank=True, rerank_depth=5, rerank_margin=0.05, rerank_max_length=64, rerank_precision="bf16")
    applied = flags.apply(config)
    assert (applied.rerank, applied.rerank_depth, applied.rerank_max_length) == (True, 5, 64)
    assert applied.rerank_margin == 0.05
    assert applied.rerank_precision == "bf16"
    assert StageFlags().apply(applied) == applied  # flags not given keep the index's settings


def test_pipeline_json_is_nested_by_stage_and_a_file_of_the_flat_format_is_read_and_rewritten(tmp_path):
    path = tmp_path / "pipeline.json"
    flat = {"mode": "dense", "summarize": True, "query_source": "both", "rerank": True, "rerank_depth": 7}
    path.write_text(json.dumps({**flat, "threshold": 0.4}), encoding="utf-8")  # the first format, one threshold
    config = read_config(tmp_path)
    assert (config.rerank_depth, config.stage("rerank").depth, config.stage("rewrite").on) == (7, 7, True)
    assert config.thresholds == {"dense+rerank@both": 0.4} and config.threshold is None

    store_threshold(tmp_path, config, 0.5)  # a change writes the file again, in format 2
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert saved["format"] == 2 and saved["mode"] == "dense" and "rerank_depth" not in saved
    assert saved["stages"]["rerank"] == {**asdict(RerankSettings()), "on": True, "depth": 7}
    assert saved["stages"]["rewrite"]["on"] is True and set(saved["stages"]) == {stage.name for stage in STAGES}
    assert saved["thresholds"] == {"dense+rerank@both": 0.5}
    assert read_config(tmp_path) == config.replace(thresholds={"dense+rerank@both": 0.5})

    for wrong, refusal in (
        ({**saved, "format": 3}, "format 3 is not one this medfaq reads"),
        ({**saved, "stages": {"rerank": {"deep": 3}}}, "unknown setting.s. of the rerank stage: deep"),
        ({**saved, "stages": {"rewind": {}}}, "unknown pipeline stage 'rewind'"),
        ({**saved, "stages": {"rerank": {"depth": 0}}}, "rerank_depth must be a whole number of at least 1"),
    ):
        path.write_text(json.dumps(wrong), encoding="utf-8")
        with pytest.raises(MedfaqError, match=f"pipeline.json is not a valid pipeline config: {refusal}"):
            read_config(tmp_path)


def test_stage_loaders_build_stages_from_config(monkeypatch, index):
    import medfaq.retriever.model_cache as model_cache

    monkeypatch.setattr(model_cache, "_STAGE_LOADERS", {})
    with pytest.raises(MedfaqError, match="no rerank stage is available"):
        build_pipeline(index, PipelineConfig(rerank=True, reranker="cross"))
    register_stage_loader("rerank", lambda name: PreferMigraine())
    pipeline = build_pipeline(index, PipelineConfig(rerank=True, reranker="cross"))
    assert isinstance(pipeline.reranker, PreferMigraine)
