"""Property-based tests: Schemathesis drives every endpoint of a real uvicorn server from the server's own OpenAPI
schema with generated valid and invalid requests (never a 5xx, answers as the schema says, rejected writes leave the
index as it was), and Hypothesis feeds the collection readers arbitrary bytes (FAQs or one clean error)."""

from __future__ import annotations

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.generation import GenerationMode

from medfaq.app.server import create_app
from medfaq.app.service import SearchService
from medfaq.common.runtime import MedfaqError
from medfaq.index.collections import load_collection
from medfaq.index.faq_index import FaqIndex
from medfaq.index.records import FaqRecord, record_problem
from medfaq.index.storage import disk_version
from tests.conftest import FAQ_ROWS
from tests.servers import serving

API_EXAMPLES = 25  # generated requests per endpoint and generation mode: bounded so the suite stays fast
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def api(tmp_path_factory, tiny_encoder):
    """A real server over a tiny index, writes allowed, and the index directory it serves."""
    folder = tmp_path_factory.mktemp("api")
    index_dir = folder / "idx"
    FaqIndex.build([FaqRecord.from_dict(row) for row in FAQ_ROWS], tiny_encoder, progress=False).save(index_dir)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MEDFAQ_HOME", str(folder / "home"))
        patch.delenv("MEDFAQ_API_KEY", raising=False)
        service = SearchService(index_dir, feedback_path=folder / "feedback.sqlite3")
        with serving(create_app(service, allow_writes=True)) as url:
            yield url, index_dir


@pytest.mark.parametrize("mode", list(GenerationMode), ids=str)
def test_every_endpoint_answers_generated_requests_as_its_schema_says(api, mode):
    url, index_dir = api
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {operation.path for operation in operations} >= {"/search", "/feedback", "/index/add", "/health"}
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and not operation.body:
            continue  # nothing to make invalid in a request without a body or parameters

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=API_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
        def answers_as_the_schema_says(case):
            before = disk_version(index_dir)
            response = case.call(base_url=url, timeout=60)
            case.validate_response(response, checks=CHECKS)
            if case.path.startswith("/index/") and response.status_code >= 400:
                assert disk_version(index_dir) == before, "a rejected write changed the index"

        answers_as_the_schema_says()


@st.composite
def collection_lines(draw) -> bytes:
    """JSONL-ish bytes: mostly FAQ objects with odd ids and questions, some broken lines and raw bytes."""
    text = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
    row = st.fixed_dictionaries({"id": st.one_of(text, st.integers()), "question": text}, optional={"answer": text})
    line = st.one_of(row.map(lambda value: json.dumps(value).encode()), st.binary(max_size=30), text.map(str.encode))
    return b"\n".join(draw(st.lists(line, max_size=6)))


@pytest.mark.parametrize("format", ["jsonl", "csv"])
@pytest.mark.parametrize("skip_bad", [False, True])
@given(data=st.one_of(st.binary(max_size=300), collection_lines()))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_collection_readers_give_faqs_or_one_clean_error(tmp_path, format, skip_bad, data):
    path = tmp_path / f"faqs.{format}"
    path.write_bytes(data)
    try:
        records, report = load_collection(path, format, skip_bad=skip_bad)
    except MedfaqError as error:
        assert str(error) and "\n" not in str(error)
        return
    assert report.loaded == len(records) == len({record.id for record in records})
    assert all(record_problem(record) is None for record in records)
