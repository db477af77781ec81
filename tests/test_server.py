"""`medfaq serve`: the API contract, validation as 4xx, API key, read-only default, reload, feedback kept across
restarts, and a bounded concurrent load on a real uvicorn server (loopback) answering as serial requests do."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import pytest
from fastapi.testclient import TestClient

from medfaq.app.server import API_KEY_ENV, NOT_JSON, ServerLimits, create_app
from medfaq.app.service import SearchService
from medfaq.eval.load_test import run_load, serial_answers
from medfaq.index.faq_index import FaqIndex
from medfaq.index.records import FaqRecord
from tests.conftest import FAQ_ROWS
from tests.servers import free_port, serving

QUESTIONS = ["can i drink alcohol on amoxicillin", "what are diabetes symptoms", "is parkinson inherited"]


@pytest.fixture
def index_dir(tmp_path, tiny_encoder):
    directory = tmp_path / "idx"
    FaqIndex.build([FaqRecord.from_dict(row) for row in FAQ_ROWS], tiny_encoder, progress=False).save(directory)
    return directory


@pytest.fixture
def service(index_dir, tmp_path):
    return SearchService(index_dir, feedback_path=tmp_path / "feedback.sqlite3")


def client_for(service, client: tuple[str, int] = ("127.0.0.1", 50000), **options) -> TestClient:
    """A test client calling from `client` (loopback unless given)."""
    return TestClient(create_app(service, **options), client=client)


def test_search_contract_single_and_batch(service):
    client = client_for(service)
    single = client.post("/search", json={"question": QUESTIONS[0], "top_k": 3, "mode": "dense"})
    assert single.status_code == 200
    body = single.json()
    assert list(body)[:4] == ["query", "summary", "entities", "hits"]
    assert {"abstained", "confidence", "timings_ms"} <= set(body)
    assert len(body["hits"]) == 3
    assert {"id", "score", "rank", "question", "answer", "source", "url", "stage_scores"} <= set(body["hits"][0])
    batch = client.post("/search", json={"questions": QUESTIONS, "top_k": 3, "mode": "dense"}).json()["results"]
    assert [answer["query"] for answer in batch] == QUESTIONS
    assert [hit["id"] for hit in batch[0]["hits"]] == [hit["id"] for hit in body["hits"]]
    assert service.pipeline({"rerank_margin": 0.05}).config.rerank_margin == 0.05  # a request may set the gate


@pytest.mark.parametrize(
    ("payload", "status"),
    [
        ({"question": ""}, 422),
        ({"question": "   "}, 422),
        ({}, 422),
        ({"question": "a", "questions": ["b"]}, 422),
        ({"question": 5}, 422),
        ({"question": "a", "top_k": 0}, 422),
        ({"question": "a", "top_k": "ten"}, 422),
        ({"question": "a", "top_k": 1000}, 422),
        ({"question": "a", "mode": "fuzzy"}, 422),
        ({"question": "a", "threshold": "NaN"}, 422),
        ({"question": "a", "rerank_margin": -0.1}, 422),
        ({"question": "a", "rerank_margin": "Infinity"}, 422),
        ({"questions": ["a"] * 65}, 413),
    ],
)
def test_bad_requests_are_4xx_with_a_message(service, payload, status):
    response = client_for(service).post("/search", json=payload)
    assert response.status_code == status
    assert response.json()["detail"]


@pytest.mark.parametrize(
    "setting",
    [
        {"top_k": True},
        {"top_k": "3"},
        {"top_k": 2.5},
        {"threshold": "0.5"},
        {"threshold": True},
        {"rerank_margin": False},
        {"abstain": 1},
        {"summarize": "yes"},
        {"rerank": "true"},
        {"mode": 1},
    ],
)
def test_request_settings_take_their_declared_type_strictly(service, setting):
    """No bool for a number, no text for a number or a bool: the request types come from the declarations."""
    response = client_for(service).post("/search", json={"question": QUESTIONS[0], **setting})
    assert response.status_code == 422
    assert response.json()["detail"].startswith(f"{next(iter(setting))}: ")


def test_the_request_model_is_built_from_the_pipeline_settings_declarations(service):
    from medfaq.app.server import SearchRequest
    from medfaq.retriever.pipeline import pipeline_settings

    declared = {name: d for name, d in pipeline_settings().items() if d.setting.request}
    fields = SearchRequest.model_fields
    assert set(fields) == {"question", "questions", *declared}
    assert all(fields[name].description == setting.describe() for name, setting in declared.items())
    client = client_for(service)
    whole = client.post("/search", json={"question": QUESTIONS[0], "threshold": 1, "top_k": 2})  # 1 is a number
    assert whole.status_code == 200 and len(whole.json()["hits"]) == 2


def test_a_body_that_is_no_json_object_is_one_clear_line(service):
    client = client_for(service)
    for headers in ({}, {"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"}):
        response = client.post("/search", content=b'{"question": "flu"}', headers=headers)
        assert response.status_code == 422
        assert response.json()["detail"] == NOT_JSON


@pytest.mark.parametrize("key", [None, "secret"])
def test_a_request_setting_its_own_threshold_queues_only_with_the_api_key(service, monkeypatch, key):
    """`threshold` and `abstain` are declared `needs_key`: an anonymous request that sets them is answered, but its
    abstained question never reaches the experts' queue; one with the API key queues it."""
    if key:
        monkeypatch.setenv(API_KEY_ENV, key)
    client = client_for(service)
    strict = {"question": QUESTIONS[0], "threshold": 2.0, "abstain": True}
    anonymous = client.post("/search", json=strict)
    assert anonymous.status_code == 200 and anonymous.json()["abstained"] is True
    assert service.unanswered() == []
    keyed = client.post("/search", json={**strict, "question": QUESTIONS[1]}, headers={"X-API-Key": key or "guess"})
    assert keyed.json()["abstained"] is True
    assert [row["query"] for row in service.unanswered()] == ([QUESTIONS[1]] if key else [])


def test_queue_answers_blank_text_alike_and_an_unknown_group_is_404(service):
    client = client_for(service, allow_writes=True)
    blank = [
        client.post("/queue/1/answer", json={"question": "q", "answer": answer}).json()["detail"]
        for answer in ("", "   ")
    ]
    assert blank == ["answer: must not be empty"] * 2
    assert client.post("/queue/1/link", json={"faq_id": " "}).status_code == 422
    missing = client.post("/queue/999/link", json={"faq_id": "f1"})
    assert missing.status_code == 404 and "no group 999" in missing.json()["detail"]


def test_body_size_limit_and_invalid_json(service):
    client = client_for(service, limits=ServerLimits(max_body_bytes=200))
    assert client.post("/search", json={"question": "x" * 500}).status_code == 413
    for raw in (b"{not json", b'{"question": "a", "threshold": NaN}', b'{"question": "caf\\udce9"}'):
        bad = client.post("/search", content=raw, headers={"content-type": "application/json"})
        assert bad.status_code in (400, 422), raw


def test_feedback_needs_the_key_when_set_and_survives_a_restart(service, index_dir, tmp_path, monkeypatch):
    payload = {"question": QUESTIONS[0], "faq_id": "f1", "helpful": True, "comment": "spot on"}
    assert client_for(service).post("/feedback", json=payload).status_code == 201
    monkeypatch.setenv("MEDFAQ_API_KEY", "s3cret")
    assert client_for(service).post("/feedback", json=payload).status_code == 401
    assert client_for(service).post("/feedback", json=payload, headers={"X-API-Key": "s3cret"}).status_code == 201
    assert client_for(service).post("/feedback", json={"question": "q"}).status_code in (401, 422)
    surrogate = b'{"question": "caf\\udce9", "faq_id": "f1", "helpful": true}'
    posted = client_for(service).post("/feedback", content=surrogate, headers={"X-API-Key": "s3cret"})
    assert posted.status_code == 422
    restarted = SearchService(index_dir, feedback_path=tmp_path / "feedback.sqlite3")
    stored = restarted.feedback.all()
    assert len(stored) == 2 and all(row.hit_ids == ["f1"] and row.helpful for row in stored)
    unhelpful = {**payload, "helpful": False}
    assert client_for(service).post("/feedback", json=unhelpful, headers={"X-API-Key": "s3cret"}).status_code == 201
    [group] = client_for(service).get("/queue", headers={"X-API-Key": "s3cret"}).json()["groups"]
    assert [(q["text"], q["source"]) for q in group["questions"]] == [(QUESTIONS[0], "not helpful")]


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ({"helpful": "off"}, 422),
        ({"helpful": 0}, 422),
        ({"faq_id": 1}, 422),
        ({"question": "  "}, 422),
        ({"comment": 5}, 422),
        ({"faq_id": "no-such-faq"}, 404),
    ],
)
def test_feedback_takes_strict_types_and_an_faq_of_the_index(service, change, status):
    payload = {"question": QUESTIONS[0], "faq_id": "f1", "helpful": False, **change}
    response = client_for(service).post("/feedback", json=payload)
    assert response.status_code == status and response.json()["detail"], response.text
    assert service.feedback.all() == [] and service.queue_groups() == []  # nothing stored, nothing queued


def test_a_body_that_is_not_utf8_is_a_422_on_every_endpoint(service):
    client = client_for(service, allow_writes=True)
    routes = [route for route in create_app(service).routes if getattr(route, "body_field", None) is not None]
    assert {route.path for route in routes} >= {"/search", "/feedback", "/index/add", "/queue/{group_id}/link"}
    for route in routes:
        [method] = route.methods
        path = route.path.replace("{group_id}", "1")
        sent = client.request(
            method, path, content=b'{"question": "caf\xe9"}', headers={"content-type": "application/json"}
        )
        assert sent.status_code == 422 and "not valid JSON (not UTF-8" in sent.json()["detail"], (path, sent.text)


def test_an_index_damaged_in_place_is_a_503_reported_by_health_until_mended(service, index_dir):
    client = client_for(service)
    assert client.post("/search", json={"question": QUESTIONS[0]}).status_code == 200
    records = index_dir / "records.jsonl"
    intact = records.read_bytes()
    records.write_text("garbage\n")  # overwritten in place: the served index reads its records from this file
    refused = client.post("/search", json={"question": QUESTIONS[0]})
    assert refused.status_code == 503 and "checksum mismatch for records.jsonl" in refused.json()["detail"]
    assert client.post("/search", json={"questions": QUESTIONS}).status_code == 503
    health = client.get("/health").json()
    assert health["status"] == "degraded" and "damaged on disk" in health["fault"]
    records.write_bytes(intact)
    assert client.post("/search", json={"question": QUESTIONS[0]}).status_code == 200
    assert client.get("/health").json()["status"] == "ok"


def test_index_writes_only_when_allowed_and_served_at_once(service):
    faq = {"id": "n1", "question": "How long does chickenpox last?", "answer": "About a week."}
    assert client_for(service).post("/index/add", json={"faqs": [faq]}).status_code == 403
    client = client_for(service, allow_writes=True)
    assert client.post("/index/add", json={"faqs": [faq]}).json() == {"added": 1}
    assert client.get("/health").json()["faqs"] == len(FAQ_ROWS) + 1
    assert client.post("/index/add", json={"faqs": []}).status_code == 422
    assert client.post("/index/delete", json={"ids": ["n1"]}).json() == {"removed": 1}
    assert client.get("/health").json()["faqs"] == len(FAQ_ROWS)


def test_adaptation_starts_in_the_background_as_a_write_one_run_at_a_time(service, monkeypatch):
    import threading

    from medfaq.retriever.decisions import adaptation

    release = threading.Event()

    def slow_adapt(directory, config, progress=True, log=print):
        release.wait(10)
        return {"applied": ["phrasings"], "questions_written": config.questions_per_faq * 6}

    monkeypatch.setattr(adaptation, "adapt", slow_adapt)
    assert client_for(service).post("/index/adapt", json={}).status_code == 403  # no --allow-writes
    client = client_for(service, allow_writes=True)
    assert client.get("/index/adapt").json()["state"] == "idle"
    assert client.post("/index/adapt", json={"questions": 0}).status_code == 422
    assert client.post("/index/adapt", json={"parts": ["everything"]}).status_code == 422
    started = client.post("/index/adapt", json={"questions": 2, "parts": ["phrasings"]})
    assert started.status_code == 202 and started.json()["state"] == "running"
    busy = client.post("/index/adapt", json={})
    assert busy.status_code == 409 and "is running since" in busy.json()["detail"]
    release.set()
    finished = service.adaptation.wait(10)
    assert finished["state"] == "done" and finished["record"] == {"applied": ["phrasings"], "questions_written": 12}
    assert client.get("/index/adapt").json() == finished


def test_a_failed_adaptation_says_why_and_the_index_goes_on_serving(service):
    client = client_for(service, allow_writes=True)
    assert client.post("/index/adapt", json={"questions": 1}).status_code == 202
    failed = service.adaptation.wait(60)
    assert failed["state"] == "failed" and "medfaq setup --model question-writer" in failed["error"]
    assert client.post("/search", json={"question": QUESTIONS[0]}).status_code == 200


def test_serve_help_names_every_endpoint_each_allow_option_opens(service):
    import typer

    from medfaq.app.cli import app

    routes = [route for route in create_app(service).routes if hasattr(route, "dependant")]
    helps = {param.name: param.help for param in typer.main.get_command(app).commands["serve"].params}
    for option, guard in {"allow_writes": "may_write", "allow_public_queue": "may_read_queue"}.items():
        guarded = [route.path for route in routes if guard in {d.call.__name__ for d in route.dependant.dependencies}]
        assert guarded and all(path in helps[option] for path in guarded), (option, guarded)


def test_health_and_reload_of_a_newer_index_on_disk(service, index_dir, tiny_encoder):
    client = client_for(service)
    before = client.get("/health").json()
    assert before["status"] == "ok" and before["faqs"] == len(FAQ_ROWS) and before["version"]
    assert before["likelihood"] is None and before["reranker"] is None  # no decision recorded for this index
    client.post("/search", json={"question": QUESTIONS[0], "mode": "dense"})
    assert client.get("/health").json()["encoder_backend"] in ("onnx", "torch-bf16")  # `auto` on a CPU
    from medfaq.retriever.decisions import likelihood_choice, reranker_choice

    likelihood_choice.write_choice(index_dir, {"on": False, "rule": "r"})
    reranker_choice.write_choice(index_dir, {"on": True, "rule": "q"})
    health = client.get("/health").json()
    assert health["likelihood"] == {"on": False, "rule": "r"} and health["reranker"] == {"on": True, "rule": "q"}
    FaqIndex.add_to(index_dir, [FaqRecord(id="n2", question="What is shingles?")], encoder=tiny_encoder, progress=False)
    after = client.get("/health").json()
    assert after["faqs"] == len(FAQ_ROWS) + 1 and after["version"] != before["version"]
    assert client.get("/unanswered").json() == {"questions": []}
    assert "/search" in client.get("/openapi.json").json()["paths"]


def test_concurrent_clients_on_a_real_server_get_the_serial_answers(service):
    with serving(create_app(service)) as url:
        expected = serial_answers(url, QUESTIONS)
        result = run_load(url, QUESTIONS * 2, clients=4, expected=expected)
        assert (result.requests, result.errors, result.mismatches) == (24, 0, 0)


def test_the_queue_endpoints_act_on_the_served_index_only(service, index_dir, tmp_path):
    import shutil

    copy = SearchService(shutil.copytree(index_dir, tmp_path / "idx3"), feedback_path=tmp_path / "feedback3.sqlite3")
    for served, question in ((service, "zzqx blorf wibble"), (copy, "glonk frobble quux")):
        served.queue().add(question)
    [theirs] = copy.queue_groups()
    copy.resolve_group("link", theirs["id"], faq_id="f1", by="")
    client = client_for(service, allow_writes=True)
    [mine] = client.get("/queue").json()["groups"]
    assert mine["id"] != theirs["id"] and [q["text"] for q in mine["questions"]] == ["zzqx blorf wibble"]
    for path, body in (("undo", None), ("link", {"faq_id": "f2"}), ("split", {"question_ids": [1]})):
        refused = client.post(f"/queue/{theirs['id']}/{path}", json=body)
        assert refused.status_code == 404 and "belongs to another index" in refused.json()["detail"], refused.text
    assert client.post("/queue/merge", json={"group_ids": [mine["id"], theirs["id"]]}).status_code == 404
    assert client.post("/queue/999/undo").status_code == 404
    assert [p.faq_id for p in FaqIndex.load(copy.index_dir).phrasings()] == ["f1"]


REMOTE = ("203.0.113.9", 40000)  # a documentation address: the request never leaves the process


def test_writes_from_other_hosts_need_the_key_or_allow_public_writes(service, monkeypatch):
    group = service.queue().add("zzqx blorf wibble").group_id
    faq = {"faqs": [{"id": "n1", "question": "How long does chickenpox last?"}]}
    remote = client_for(service, REMOTE, allow_writes=True)
    for path, body in ((f"/queue/{group}/link", {"faq_id": "f1"}), (f"/queue/{group}/undo", None), ("/index/add", faq)):
        refused = remote.post(path, json=body)
        assert refused.status_code == 403 and "--allow-public-writes" in refused.json()["detail"], refused.text
    assert service.queue().group(group).status == "waiting" and "n1" not in service.index
    assert client_for(service, allow_writes=True).post(f"/queue/{group}/link", json={"faq_id": "f1"}).status_code == 200
    public = client_for(service, REMOTE, allow_writes=True, allow_public_writes=True)
    assert public.post(f"/queue/{group}/undo").status_code == 200
    monkeypatch.setenv("MEDFAQ_API_KEY", "s3cret")
    assert remote.post(f"/queue/{group}/link", json={"faq_id": "f1"}).status_code == 401
    keyed = remote.post(f"/queue/{group}/link", json={"faq_id": "f1"}, headers={"X-API-Key": "s3cret"})
    assert keyed.status_code == 200


def test_the_access_rules_name_who_may_do_what(monkeypatch):
    from medfaq.app.server import access_rules

    monkeypatch.delenv("MEDFAQ_API_KEY", raising=False)
    searches, feedback, reads, writes = access_rules(
        allow_writes=True, allow_public_queue=False, allow_public_writes=False
    )
    assert searches.startswith("searches (POST /search), health (GET /health) and the adaptation's state")
    assert feedback.endswith("any client") and "loopback clients only" in reads and "loopback clients only" in writes
    assert "nobody" in access_rules(False, True, False)[3] and "any client" in access_rules(False, True, False)[2]
    assert "any client (--allow-public-writes)" in access_rules(True, False, True)[3]
    monkeypatch.setenv("MEDFAQ_API_KEY", "s3cret")
    assert all("with the API key" in rule for rule in access_rules(True, True, True)[1:])


def test_serve_says_it_is_ready_once_it_accepts_connections(index_dir, tmp_path):
    ready = tmp_path / "ready"
    ready.write_text("an earlier run's")
    port = free_port()
    command = [sys.executable, "-m", "medfaq.app", "serve", "--index", str(index_dir), "--port", str(port)]
    server = subprocess.Popen([*command, "--ready-file", str(ready)], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not ready.is_file() or ready.read_text() != url + "\n":
            assert server.poll() is None and time.monotonic() < deadline, "the server never said it was ready"
            time.sleep(0.05)
        with urllib.request.urlopen(f"{url}/health", timeout=30) as health:  # at once: no retry, no wait
            assert health.status == 200
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=60)
    assert f"ready on {url}" in stderr.splitlines()
    assert not ready.exists()  # a stopped server is not ready
