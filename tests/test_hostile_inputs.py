"""What a careless or hostile client sends: each case is one clean refusal or a clear answer, never a 5xx, a
traceback, a malformed run file or a lost file. The HTTP cases run on a real uvicorn server, the command-line cases
in real `medfaq` processes (the table "Bad input: the last cases" in docs/results.md)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from medfaq.app.server import create_app
from medfaq.app.service import SearchService
from medfaq.index.faq_index import FaqIndex
from medfaq.index.records import FaqRecord
from medfaq.index.storage import MANIFEST, disk_version
from medfaq.retriever.pipeline_file import read_config, write_config
from tests.conftest import FAQ_ROWS, write_jsonl
from tests.servers import serving

REPO = Path(__file__).resolve().parents[1]
MODEL_LIBRARIES = ("torch", "transformers", "sentence_transformers")
LONG_QUESTION = "is achalasia inherited " * 4500  # 103,500 characters, over the 2,000 searched
NOWHERE = "zzqqxx qqzzyy"  # no FAQ shares a word with it


def run_medfaq(*args: object, home: Path, models: bool = True, timeout: float = 240) -> subprocess.CompletedProcess:
    """`medfaq ARGS` in a new process. Without `models` the model libraries cannot be imported in that process, so
    the command must end without loading any model."""
    blocked = () if models else MODEL_LIBRARIES
    code = (
        f"import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"
        "from medfaq.app.cli import main\nsys.argv = ['medfaq', *sys.argv[1:]]\nmain()\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MEDFAQ_HOME": str(home), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", code, *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one `error: ...` line of a command that exited 2."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "medfaq_home"


# ---- command line ------------------------------------------------------------------------------------------------


def test_trec_runs_refuse_query_ids_with_whitespace(index_dir, tmp_path, home):
    queries = write_jsonl(tmp_path / "q.jsonl", [{"id": "q1", "question": "flu"}, {"id": "q 2", "question": "flu"}])
    run = tmp_path / "run.trec"
    refused = run_medfaq("search", "--index", index_dir, "--queries", queries, "--output", run, "--format", "trec",
                         home=home, models=False)  # fmt: skip
    assert f"{queries}:2: query id 'q 2' holds whitespace" in error_line(refused)
    assert not run.exists()
    kept = run_medfaq("search", "--index", index_dir, "--queries", queries, "--output", tmp_path / "run.jsonl",
                      "--mode", "bm25", home=home)  # fmt: skip
    assert kept.returncode == 0, kept.stderr
    lines = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert [line["id"] for line in lines] == ["q1", "q 2"]  # the JSONL run carries any id


def test_faq_ids_with_whitespace_are_refused_at_build_and_add(index_dir, tmp_path, home):
    rows = [{"id": "ok1", "question": "What is flu?"}, {"id": "a b", "question": "q"}]
    bad = write_jsonl(tmp_path / "bad.jsonl", rows)
    build = run_medfaq("index", "build", bad, "--out", tmp_path / "new", home=home, models=False)
    assert f"{bad}:2: FAQ id 'a b' holds whitespace" in error_line(build)
    assert not (tmp_path / "new").exists()
    version = disk_version(index_dir)
    add = run_medfaq("index", "add", index_dir, bad, home=home, models=False)
    assert f"{bad}:2: FAQ id 'a b' holds whitespace" in error_line(add)
    assert disk_version(index_dir) == version


def test_an_add_that_adds_nothing_is_an_error(index_dir, tmp_path, home):
    blank = write_jsonl(tmp_path / "blank.jsonl", [{"id": "w4", "question": "   "}])
    version = disk_version(index_dir)
    line = error_line(run_medfaq("index", "add", index_dir, blank, home=home, models=False))
    assert "holds no FAQs to add (1 with an empty question skipped" in line and "was not changed" in line
    assert disk_version(index_dir) == version


def test_wrong_models_ids_and_dimensions_fail_before_any_model_loads(index_dir, built_index, tmp_path, home):
    build = run_medfaq("index", "build", built_index.parent / "faqs.jsonl", "--out", tmp_path / "new", "--encoder",
                       tmp_path / "no-such-model", home=home, models=False)  # fmt: skip
    assert "no-such-model" in error_line(build)
    rerank = run_medfaq("search", "--index", index_dir, "--rerank", "--reranker", tmp_path / "no-such-reranker",
                        "flu", home=home, models=False)  # fmt: skip
    assert "no-such-reranker" in error_line(rerank)
    clash = write_jsonl(tmp_path / "clash.jsonl", [{"id": "f1", "question": "What is flu?"}])
    add = run_medfaq("index", "add", index_dir, clash, home=home, models=False)
    assert "duplicate FAQ ids already in the index: 'f1'" in error_line(add)
    manifest = json.loads((index_dir / MANIFEST).read_text())
    (index_dir / MANIFEST).write_text(json.dumps({**manifest, "encoder": "minilm"}))  # 384-d model, 32-d vectors
    mismatch = run_medfaq("search", "--index", index_dir, "--mode", "dense", "flu", home=home, models=False)
    assert "gives 384-d vectors" in error_line(mismatch)


def test_serve_on_a_port_in_use_says_so_before_loading(index_dir, home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_medfaq("serve", "--index", index_dir, "--port", port, home=home, models=False, timeout=60)
    assert error_line(result) == f"error: port {port} on 127.0.0.1 is in use"


def test_a_long_question_is_searched_cut_and_says_so(index_dir, home):
    result = run_medfaq("search", "--index", index_dir, "--mode", "bm25", "--json", LONG_QUESTION, home=home)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["truncated"] is True
    assert "truncated to 2000" in result.stderr


def test_the_queries_file_is_never_the_output(index_dir, tmp_path, home):
    queries = write_jsonl(tmp_path / "q.jsonl", [{"id": "q1", "question": "flu"}])
    before = queries.read_bytes()
    result = run_medfaq("search", "--index", index_dir, "--queries", queries, "--output", queries, home=home,
                        models=False)  # fmt: skip
    assert "is the input file" in error_line(result)
    assert queries.read_bytes() == before


def test_a_question_without_a_hit_is_abstained_on_and_queued(index_dir, home):
    result = run_medfaq("search", "--index", index_dir, "--mode", "bm25", "--json", NOWHERE, home=home)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["hits"] == [] and answer["abstained"] is True
    queued = [json.loads(line) for line in (home / "unanswered.jsonl").read_text().splitlines()]
    assert [row["query"] for row in queued] == [NOWHERE]


# ---- HTTP ----------------------------------------------------------------------------------------------------------


@pytest.fixture
def service(index_dir, tmp_path, home, monkeypatch):
    monkeypatch.setenv("MEDFAQ_HOME", str(home))
    return SearchService(index_dir, feedback_path=tmp_path / "feedback.sqlite3")


def test_http_adds_follow_the_collection_rules_and_write_nothing(service, index_dir):
    version = disk_version(index_dir)
    with serving(create_app(service, allow_writes=True)) as url:
        spaced = httpx.post(f"{url}/index/add", json={"faqs": [{"id": "a b", "question": "What is flu?"}]})
        blank = httpx.post(f"{url}/index/add", json={"faqs": [{"id": "w4", "question": "   "}]})
    assert spaced.status_code == 422 and "FAQ id 'a b' holds whitespace" in spaced.json()["detail"]
    assert blank.status_code == 422 and "FAQ 'w4' has an empty question" in blank.json()["detail"]
    assert disk_version(index_dir) == version


def raw_post(url: str, head: str, chunks: list[bytes]) -> tuple[str, bytes]:
    """POST /search over a plain socket: send `head` (extra header lines) and `chunks` as they are, stop there, and
    return the status line and the body of the answer, read until the server closes the connection (a server that
    answers early and closes may reset the connection while the rest is sent, as any HTTP client then sees)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        request = f"POST /search HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{head}\r\n"
        connection.sendall(request.encode())
        try:
            for chunk in chunks:
                connection.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):  # the server answered and closed while the body streamed
            pass
        status, _, body = connection.makefile("rb").read().partition(b"\r\n\r\n")
        return status.split(b"\r\n")[0].decode(), body


def test_bodies_over_the_limit_are_413_however_framed(service):
    piece = 64 * 1024
    chunk = f"{piece:x}\r\n".encode() + b"x" * piece + b"\r\n"
    with serving(create_app(service)) as url:
        chunked = raw_post(url, "Transfer-Encoding: chunked\r\n", [chunk] * 32 + [b"0\r\n\r\n"])  # 2.1 MB
        endless = raw_post(url, "Transfer-Encoding: chunked\r\n", [chunk] * 17)  # never ends: refused after 2 s
        sized = raw_post(url, "Content-Length: 900000000\r\n", [])  # refused on its header, before any byte of it
        small = httpx.post(
            f"{url}/search", content=iter([b'{"question": ', b'"flu"}']), headers={"content-type": "application/json"}
        )
    assert chunked[0] == endless[0] == sized[0] == "HTTP/1.1 413 Request Entity Too Large"
    assert json.loads(chunked[1]) == {"detail": "request body over 1000000 bytes"}
    assert small.status_code == 200  # a chunked body under the limit is read as usual


MALFORMED = [b"", b"not json", b"[]", b"null", b"1", b'"text"', b"{}", b'{"questions": []}', b'{"nope": 1}']
WRITES = ["/feedback", "/index/add", "/index/delete"]


@pytest.mark.parametrize("path", ["/search", *WRITES])
def test_every_endpoint_answers_each_malformed_body_with_a_4xx(service, path):
    with serving(create_app(service, allow_writes=True)) as url:
        for body in MALFORMED:
            response = httpx.post(f"{url}{path}", content=body, headers={"content-type": "application/json"})
            assert 400 <= response.status_code < 500, (body, response.status_code, response.text)
            assert "\n" not in response.json()["detail"]


def test_the_experts_queue_is_private(service, monkeypatch):
    with serving(create_app(service)) as url:
        assert httpx.get(f"{url}/unanswered").status_code == 200  # loopback, no key configured
        monkeypatch.setenv("MEDFAQ_API_KEY", "s3cret")
        assert httpx.get(f"{url}/unanswered").status_code == 401
        assert httpx.get(f"{url}/unanswered", headers={"X-API-Key": "s3cret"}).status_code == 200
    monkeypatch.delenv("MEDFAQ_API_KEY")
    remote = ("203.0.113.9", 40000)  # a documentation address: the request never leaves the process
    refused = TestClient(create_app(service), client=remote).get("/unanswered")
    assert refused.status_code == 403 and "loopback" in refused.json()["detail"]
    assert TestClient(create_app(service, allow_public_queue=True), client=remote).get("/unanswered").status_code == 200


def test_a_corrupted_index_on_disk_leaves_the_loaded_one_serving(service, index_dir, tiny_encoder):
    manifest = (index_dir / MANIFEST).read_bytes()
    with serving(create_app(service)) as url:
        question = {"question": FAQ_ROWS[2]["question"], "mode": "dense"}
        before = httpx.post(f"{url}/search", json=question).json()
        (index_dir / MANIFEST).write_text("{broken")
        after = httpx.post(f"{url}/search", json=question)
        health = httpx.get(f"{url}/health").json()
        (index_dir / MANIFEST).write_bytes(manifest)
        healed = httpx.get(f"{url}/health").json()
        refused = httpx.post(f"{url}/search", json={"question": "flu", "rerank": True})
        write_config(index_dir, read_config(index_dir).updated(rerank=True))  # the index's own pipeline reranks,
        FaqIndex.add_to(index_dir, [FaqRecord(id="n1", question="What is flu?")], tiny_encoder, progress=False)
        unavailable = httpx.post(f"{url}/search", json={"question": "flu"})
    assert after.status_code == 200 and after.json()["hits"] == before["hits"]
    assert health["status"] == "degraded" and "cannot be loaded" in health["fault"]
    assert healed["status"] == "ok" and healed["fault"] is None
    assert refused.status_code == 400 and "rerank stage is not available" in refused.json()["detail"]
    assert unavailable.status_code == 503 and "rerank stage is not available" in unavailable.json()["detail"]


def test_long_questions_unmatched_questions_and_unknown_fields(service):
    with serving(create_app(service)) as url:
        long = httpx.post(f"{url}/search", json={"question": LONG_QUESTION, "mode": "bm25"}).json()
        short = httpx.post(f"{url}/search", json={"question": "is shingles inherited", "mode": "bm25"}).json()
        nowhere = httpx.post(f"{url}/search", json={"question": NOWHERE, "mode": "bm25"}).json()
        queue = httpx.get(f"{url}/unanswered").json()["questions"]
        typo = httpx.post(f"{url}/search", json={"question": "flu", "topk": 3})
    assert long["truncated"] is True and short["truncated"] is False and short["hits"]
    assert nowhere["hits"] == [] and nowhere["abstained"] is True
    assert [row["query"] for row in queue] == [NOWHERE]
    assert typo.status_code == 422 and typo.json()["detail"] == "topk: unknown field"


def test_the_serving_socket_is_tcp_so_answers_are_not_delayed():
    """asyncio sets TCP_NODELAY only on IPPROTO_TCP sockets: a socket made with protocol 0 held every answer's body
    behind its headers until the client's delayed ACK, about 40 ms a request."""
    from medfaq.app.cmd_serve import listening_socket

    with listening_socket("127.0.0.1", 0) as sock:
        assert sock.proto == socket.IPPROTO_TCP
