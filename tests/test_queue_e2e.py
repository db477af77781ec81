"""The experts' queue end to end on a real server and a real index (MiniLM): 30 paraphrases of 3 questions the
collection does not answer are abstained on and form 3 groups; an expert links one group to an FAQ and answers
another over HTTP; then every paraphrase, and new ones, finds its FAQ first, while the third group still waits."""

from __future__ import annotations

import httpx
import pytest

from medfaq.app.server import create_app
from medfaq.app.service import SearchService
from medfaq.index.encoder import Encoder
from medfaq.index.faq_index import FaqIndex
from medfaq.index.records import FaqRecord
from medfaq.retriever.pipeline import PipelineConfig
from medfaq.retriever.pipeline_file import store_threshold, write_config
from tests.conftest import FAQ_ROWS
from tests.servers import serving

pytestmark = pytest.mark.integration

ASKED = {
    "fly": [
        "can i fly after knee surgery",
        "is it safe to take a plane after knee surgery",
        "how soon can i fly after my knee operation",
        "flying after knee replacement surgery is it ok",
        "when can i travel by plane after knee surgery",
        "can i get on a flight after knee surgery",
        "is air travel safe after a knee operation",
        "how long after knee surgery can i fly",
        "plane trip after knee surgery safe?",
        "knee surgery last week, can i fly home",
    ],
    "dye": [
        "is it safe to dye my hair while pregnant",
        "can i color my hair during pregnancy",
        "hair dye and pregnancy is it safe",
        "can pregnant women dye their hair",
        "is hair coloring safe when pregnant",
        "dyeing hair while pregnant risks",
        "i am pregnant can i use hair dye",
        "should i avoid hair dye in pregnancy",
        "hair dye safe in first trimester of pregnancy?",
        "pregnant and want to dye my hair, is that ok",
    ],
    "jet lag": [
        "how long does jet lag last",
        "how many days does jet lag take to go away",
        "how long until jet lag wears off",
        "jet lag duration how long",
        "how long will my jet lag last after a long flight",
        "when does jet lag stop",
        "how long does it take to recover from jet lag",
        "jet lag lasting how many days",
        "how long is jet lag usually",
        "how many days to get over jet lag",
    ],
}
NEW_WORDINGS = {
    "fly": ["after my knee surgery am i allowed to fly", "is flying ok two weeks after knee surgery"],
    "dye": ["can i get my hair colored while pregnant", "is hair dye bad for my unborn baby"],
}
AVIATION = FaqRecord("f7", "Aviation after orthopaedic procedures", "Ask your surgeon; the risk is blood clots.")
"""In the collection, but worded so that the questions about flying after knee surgery do not find it."""


@pytest.fixture
def served(tmp_path, minilm_dir):
    records = [FaqRecord.from_dict(row) for row in FAQ_ROWS] + [AVIATION]
    index_dir = tmp_path / "idx"
    FaqIndex.build(records, Encoder(str(minilm_dir), device="cpu"), progress=False).save(index_dir)
    config = PipelineConfig(entities=False, encoder_backend="torch")
    write_config(index_dir, config)
    store_threshold(index_dir, config, 0.7)
    service = SearchService(index_dir, tmp_path / "feedback.sqlite3")
    with serving(create_app(service, allow_writes=True)) as url, httpx.Client(base_url=url, timeout=120) as client:
        yield client, index_dir


def search(client: httpx.Client, question: str) -> dict:
    response = client.post("/search", json={"question": question, "top_k": 3})
    assert response.status_code == 200, response.text
    return response.json()


def test_paraphrases_are_grouped_answered_once_and_found_first(served):
    client, index_dir = served
    for number in range(10):  # interleaved, as users would ask them
        for wordings in ASKED.values():
            assert search(client, wordings[number])["abstained"]
    groups = client.get("/queue").json()["groups"]
    by_topic = {
        topic: next(g for g in groups if {q["text"] for q in g["questions"]} == set(wordings))
        for topic, wordings in ASKED.items()
    }
    assert len(groups) == 3 and all(group["count"] == 10 for group in groups)

    linked = client.post(f"/queue/{by_topic['fly']['id']}/link", json={"faq_id": "f7", "by": "dr a"})
    assert linked.status_code == 200, linked.text
    assert linked.json()["status"] == "linked" and linked.json()["resolved_by"] == "dr a"
    answered = client.post(
        f"/queue/{by_topic['dye']['id']}/answer",
        json={"question": "Can I dye my hair while pregnant?", "answer": "Most hair dyes are considered safe."},
    )
    assert answered.status_code == 200, answered.text
    new_faq = answered.json()["faq_id"]
    assert FaqIndex.load(index_dir).get(new_faq).question == "Can I dye my hair while pregnant?"

    for topic, faq_id in (("fly", "f7"), ("dye", new_faq)):
        for question in ASKED[topic] + NEW_WORDINGS[topic]:
            result = search(client, question)
            assert not result["abstained"] and result["hits"][0]["id"] == faq_id, (question, result["hits"][:1])
    for question in ASKED["jet lag"]:
        assert search(client, question)["abstained"]
    waiting = client.get("/queue").json()["groups"]
    assert [group["id"] for group in waiting] == [by_topic["jet lag"]["id"]]
    assert waiting[0]["count"] == 20  # asked again meanwhile: the same group, twice as often
    resolved = {group["id"]: group["status"] for group in client.get("/queue?status=all").json()["groups"]}
    assert resolved[by_topic["fly"]["id"]] == "linked" and resolved[by_topic["dye"]["id"]] == "answered"
