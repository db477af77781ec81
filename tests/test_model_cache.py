"""The stage cache: the server, the demo and the command line take the same stage objects for one config, keyed by
every setting a loader reads and by the model's files; a running server follows an edited pipeline.json; concurrent
first requests load a stage once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from medfaq.app.server import create_app
from medfaq.app.service import SearchService
from medfaq.common.runtime import MedfaqError
from medfaq.retriever import model_cache
from medfaq.retriever.model_cache import StageCache, StageLoader, register_stage_loader, shared_cache
from medfaq.retriever.pipeline import PipelineConfig
from medfaq.retriever.pipeline_file import PIPELINE_FILE, read_config, write_config
from tests.conftest import FAQ_ROWS
from tests.servers import serving
from tests.test_onnx_reranker import trained

QUESTION = FAQ_ROWS[2]["question"]


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory, tiny_bert_dir):
    """A tiny cross-encoder, as `medfaq train crossencoder` saves one."""
    return trained(tmp_path_factory.mktemp("cache"), tiny_bert_dir)


@pytest.fixture
def demo_page(monkeypatch):
    """The demo's resources and search page, called as functions (no browser, no Streamlit server)."""
    import streamlit as st

    from medfaq.app.ui import resources, search_page

    monkeypatch.setenv("MEDFAQ_DEMO_SUMMARIZER", "none")
    monkeypatch.setenv("MEDFAQ_DEMO_NO_TRAIN", "1")
    st.cache_resource.clear()
    yield resources, search_page
    st.cache_resource.clear()


def test_server_demo_and_cli_take_the_same_stages_for_one_config(index_dir, reranker_dir, demo_page, monkeypatch):
    from medfaq.app.cmd_search import StageFlags, open_pipeline, search_config

    def searched(flags: StageFlags):  # the path `medfaq search` takes
        return open_pipeline(index_dir, search_config(index_dir, flags))

    resources, search_page = demo_page
    write_config(index_dir, PipelineConfig(rerank=True, reranker=str(reranker_dir), encoder_backend="torch", top_k=3))
    monkeypatch.setenv("MEDFAQ_DEMO_INDEX", str(index_dir))
    monkeypatch.setenv("MEDFAQ_DEMO_RERANKER", str(reranker_dir))

    served = SearchService(index_dir, feedback_path=index_dir.parent / "feedback.sqlite3").pipeline()
    cli = searched(StageFlags())
    demo = resources.settings()
    stages = resources.ready_stages(demo)
    controls = search_page.Controls(summarize=False, rerank=True, likelihood=False, mode="dense", top_k=3)
    page = search_page.build_pipeline(stages, controls, resources.base_config(demo))

    assert served.reranker is not None and served.entity_finder is not None
    assert served.reranker is cli.reranker is stages.reranker is page.reranker
    assert served.entity_finder is cli.entity_finder is stages.entity_finder is page.entity_finder
    assert served.run(QUESTION).to_dict()["hits"] == cli.run(QUESTION).to_dict()["hits"]
    [key] = [key for key in shared_cache().loaded() if key.kind == "rerank"]
    assert key.model == str(reranker_dir.resolve()) and key.stamp
    assert dict(key.settings) == {
        "quantize": False,
        "rerank_max_length": None,
        "rerank_precision": "fp32",
        "encoder_backend": "torch",
    }

    for change in ({"rerank_max_length": 16}, {"rerank_precision": "bf16"}):
        flagged = searched(StageFlags(**change)).reranker
        assert flagged is not served.reranker
        write_config(index_dir, read_config(index_dir).replace(**change))
        assert searched(StageFlags()).reranker is flagged  # the same setting, the same stage
        write_config(index_dir, read_config(index_dir).replace(rerank_max_length=None, rerank_precision="fp32"))
    assert searched(StageFlags()).reranker is served.reranker


def test_a_retrained_model_is_a_new_stage_and_the_old_one_is_dropped(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")
    loads = []
    loader = StageLoader(lambda name, settings: loads.append(name) or object(), reads=("quantize",))
    cache = StageCache()
    config = PipelineConfig(rerank=True, reranker=str(model))
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(model_cache._STAGE_LOADERS, "rerank", loader)
        first = cache.stage("rerank", str(model), config)
        assert cache.stage("rerank", str(model), config) is first
        (model / "medfaq-onnx.lock").write_text("")  # a lock beside an export made on first use: the same model
        (model / "medfaq-onnx").mkdir()
        assert cache.stage("rerank", str(model), config) is first
        (model / "config.json").write_text('{"retrained": true}', encoding="utf-8")
        second = cache.stage("rerank", str(model), config)
        assert second is not first and list(cache.loaded().values()) == [second]
        quantized = cache.stage("rerank", str(model), config.replace(quantize=True))
        assert quantized is not second and len(loads) == 3
        depth = config.replace(rerank_depth=3, rerank_fusion="replace")  # read by the pipeline, not the loader
        assert cache.stage("rerank", str(model), depth) is second


FRESH_BUILD = """
import sys
from medfaq.common.runtime import MedfaqError
from medfaq.index.faq_index import FaqIndex
from medfaq.retriever.model_cache import build_pipeline
from medfaq.retriever.pipeline import PipelineConfig

index, reranker = sys.argv[1:]
config = PipelineConfig(rerank=True, reranker=reranker, entities=True, encoder_backend="torch")
pipeline = build_pipeline(FaqIndex.load(index), config)
print(type(pipeline.reranker).__name__, pipeline.entity_finder is not None)
for wanted in ({"summarize": True, "query_source": "summary"}, {"likelihood": True}):
    try:
        build_pipeline(FaqIndex.load(index), config.updated(summarizer="no-such-summarizer", **wanted))
    except MedfaqError as error:
        print(error)
"""


def test_a_fresh_interpreter_importing_only_the_pipeline_builder_gets_every_stage(index_dir, reranker_dir):
    """No module has to be imported for its side effect first: the builder's own registry holds every stage."""
    ran = subprocess.run(
        [sys.executable, "-c", FRESH_BUILD, str(index_dir), str(reranker_dir)], capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    built, *summarizer_errors = ran.stdout.splitlines()
    assert built == "CrossEncoderReranker True"
    assert len(summarizer_errors) == 2
    assert all(
        "no-such-summarizer" in line and "not available in this installation" not in line for line in summarizer_errors
    )


def test_a_loader_reads_only_what_it_declares_and_errors_stay_one_line(index_dir):
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(model_cache._STAGE_LOADERS, "rerank", StageLoader(lambda name, s: s.top_k, reads=("quantize",)))
        with pytest.raises(AttributeError, match="reads 'top_k' without declaring it"):
            StageCache().stage("rerank", None, PipelineConfig())
    with pytest.raises(ValueError, match="unknown pipeline setting"):
        register_stage_loader("rerank", lambda name, s: None, reads=("rerank_speed",))

    missing = index_dir.parent / "no-such-reranker"
    with pytest.raises(MedfaqError) as error:
        StageCache().stage("rerank", str(missing), PipelineConfig(rerank=True))
    assert error.value.kind == "rerank" and str(missing) in str(error.value) and "\n" not in str(error.value)
    stages, missing_stages = StageCache().optional_stages(PipelineConfig(reranker=str(missing)))
    assert stages == {"rewriter": None, "reranker": None, "likelihood": None}
    assert [line.split(":")[0] for line in missing_stages] == ["rewrite", "rerank", "likelihood"]


def ask(url: str) -> dict:
    response = httpx.post(f"{url}/search", json={"question": QUESTION}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_running_server_answers_the_next_request_with_an_edited_pipeline_json(index_dir, tmp_path):
    write_config(index_dir, PipelineConfig(top_k=3, entities=False, log_unanswered=False))
    service = SearchService(index_dir, feedback_path=tmp_path / "feedback.sqlite3")
    path = index_dir / PIPELINE_FILE
    with serving(create_app(service)) as url:
        assert len(ask(url)["hits"]) == 3
        write_config(index_dir, read_config(index_dir).replace(top_k=2))
        assert len(ask(url)["hits"]) == 2
        path.write_text(path.read_text(encoding="utf-8").replace('"top_k": 2', '"top_k": 4'), encoding="utf-8")
        assert len(ask(url)["hits"]) == 4  # an edit in place of the same size, within the same second
        assert not ask(url)["abstained"]
        write_config(index_dir, read_config(index_dir).replace(abstain=True, threshold=2.0))
        assert ask(url)["abstained"]
        assert httpx.get(f"{url}/health").json()["config"]["threshold"] == 2.0

        for invalid in ('{"top_k": 0}', "{broken", "[]"):
            path.write_text(invalid, encoding="utf-8")
            answer = ask(url)
            assert answer["abstained"] and len(answer["hits"]) == 4  # the config loaded before
            health = httpx.get(f"{url}/health").json()
            assert health["status"] == "degraded" and "pipeline.json is not a valid pipeline config" in health["fault"]
            assert "\n" not in health["fault"] and health["config"]["top_k"] == 4
        write_config(index_dir, PipelineConfig(top_k=1, entities=False, log_unanswered=False))
        answer = ask(url)
        assert len(answer["hits"]) == 1 and not answer["abstained"]
        assert httpx.get(f"{url}/health").json()["fault"] is None


def test_concurrent_first_requests_load_a_stage_once(index_dir, tmp_path, monkeypatch):
    from tests.test_pipeline_stages import CountingReranker

    loads = []

    def slow_load(name, settings):
        loads.append(name)
        time.sleep(0.5)  # the other requests arrive while the first one loads
        return CountingReranker()

    monkeypatch.setitem(model_cache._STAGE_LOADERS, "rerank", StageLoader(slow_load, reads=("quantize",)))
    write_config(index_dir, PipelineConfig(rerank=True, reranker="counting", entities=False, log_unanswered=False))
    service = SearchService(index_dir, feedback_path=tmp_path / "feedback.sqlite3")
    with serving(create_app(service)) as url, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: ask(url), range(8)))
    assert loads == ["counting"] and [key.label for key in shared_cache().loaded()] == ["rerank:counting"]
    assert all("rerank" in answer["hits"][0]["stage_scores"] for answer in answers)
    assert json.dumps(answers[0]["hits"]) == json.dumps(answers[-1]["hits"])

    shared_cache().clear()
    together = threading.Barrier(8)

    def pipeline_at_once(_):
        together.wait()
        return service.pipeline()

    with ThreadPoolExecutor(8) as pool:
        pipelines = list(pool.map(pipeline_at_once, range(8)))
    assert len(loads) == 2 and len({id(pipeline.reranker) for pipeline in pipelines}) == 1
    assert len({id(pipeline._locks["rerank"]) for pipeline in pipelines}) == 1  # one stage, one lock
