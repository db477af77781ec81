"""Micro-batching of concurrent searches: each caller gets its own answer, the one its question gets alone, while
concurrent calls are grouped (the batcher alone, the pipeline's exact batches, and a real uvicorn server)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from medfaq.app.batching import BatchSettings, MicroBatcher
from medfaq.app.server import create_app
from medfaq.app.service import SearchService
from medfaq.common.runtime import MedfaqError
from medfaq.index.faq_index import FaqIndex
from medfaq.index.records import FaqRecord
from medfaq.retriever.model_cache import build_pipeline
from medfaq.retriever.pipeline import Pipeline, PipelineConfig
from tests.conftest import FAQ_ROWS
from tests.servers import serving

QUESTIONS = [
    "can i drink alcohol on amoxicillin",
    "what are the symptoms of diabetes, i am always thirsty and i go to the toilet all night long",
    "shingles treatment",
    "is parkinson inherited? my father and his brother both had it and i am worried about my children",
    "migraine",
    "how do vaccines protect children against measles",
]


def ask_together(function, items: list, rounds: int = 1) -> list:
    """`function(item)` for every item from one thread each, all released at once, `rounds` times."""
    start = threading.Barrier(len(items))

    def call(item):
        answers = []
        for _ in range(rounds):
            start.wait(timeout=30)
            answers.append(function(item))
        return answers

    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(call, items))


def test_batcher_groups_concurrent_calls_and_returns_each_its_own_result():
    batches: list[list[int]] = []

    def square_all(items: list[int]) -> list[int]:
        batches.append(list(items))
        time.sleep(0.01)  # calls arriving meanwhile form the next batch
        return [item * item for item in items]

    batcher = MicroBatcher(square_all, BatchSettings(max_size=4, max_wait_ms=20))
    answers = ask_together(batcher.submit, list(range(10)), rounds=3)
    assert answers == [[item * item] * 3 for item in range(10)]
    assert sorted(item for batch in batches for item in batch) == sorted(list(range(10)) * 3)
    assert max(len(batch) for batch in batches) > 1 and all(len(batch) <= 4 for batch in batches)
    assert batcher.submit(7) == 49 and batches[-1] == [7]  # a lone caller runs alone


def test_parallel_batches_run_at_the_same_time_and_never_more_than_allowed():
    running, most = [0], [0]
    guard = threading.Lock()

    def slow_double(items: list[int]) -> list[int]:
        with guard:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with guard:
            running[0] -= 1
        return [item * 2 for item in items]

    for parallel in (1, 2):
        most[0] = 0
        batcher = MicroBatcher(slow_double, BatchSettings(max_size=2, max_wait_ms=0, parallel=parallel))
        assert ask_together(batcher.submit, list(range(8)), rounds=2) == [[item * 2] * 2 for item in range(8)]
        assert most[0] == parallel


def test_batcher_raises_an_error_only_in_the_call_it_belongs_to():
    def run(items: list[int]) -> list[int | Exception]:
        if 0 in items and len(items) == 1:
            raise RuntimeError("the whole batch failed")
        return [MedfaqError(f"bad item {item}") if item == 3 else item + 1 for item in items]

    batcher = MicroBatcher(run, BatchSettings(max_size=8, max_wait_ms=20))
    outcomes = ask_together(lambda item: _outcome(batcher.submit, item), [1, 2, 3, 4])
    assert outcomes == [[2], [3], ["MedfaqError: bad item 3"], [5]]
    assert _outcome(batcher.submit, 0) == "RuntimeError: the whole batch failed"


def _outcome(function, item):
    try:
        return function(item)
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {error}"


@pytest.mark.parametrize("settings", [(0, 1000), (2, -1), (2, 1001), (2, 2, 0)])
def test_batch_settings_out_of_range_are_one_line_errors(settings):
    with pytest.raises(MedfaqError, match="must be at least 1"):
        BatchSettings(*settings)


@pytest.fixture
def index_dir(tmp_path, tiny_encoder):
    directory = tmp_path / "idx"
    FaqIndex.build([FaqRecord.from_dict(row) for row in FAQ_ROWS], tiny_encoder, progress=False).save(directory)
    return directory


def without_timings(answer: dict) -> dict:
    return {key: value for key, value in answer.items() if key != "timings_ms"}


def test_exact_batches_answer_bit_for_bit_as_questions_alone(index_dir):
    index = FaqIndex.load(index_dir)
    for mode in ("dense", "hybrid"):
        config = PipelineConfig(mode=mode, top_k=6, entities=False, log_unanswered=False)
        pipeline = build_pipeline(index, config)
        alone = [without_timings(pipeline.run(question).to_dict()) for question in QUESTIONS]
        exact = Pipeline(index, config, exact_batches=True).run_batch(QUESTIONS)
        assert [without_timings(response.to_dict()) for response in exact] == alone


def test_concurrent_requests_on_a_real_server_are_batched_and_each_gets_its_serial_answer(index_dir, tmp_path):
    settings = BatchSettings(max_size=8, max_wait_ms=50)  # one batch at a time: the others wait and join the next
    service = SearchService(index_dir, tmp_path / "feedback.sqlite3", settings)
    batch_sizes: list[int] = []
    search_grouped = service._batcher.run

    def counted(asked):
        batch_sizes.append(len(asked))
        time.sleep(0.05)  # a batch takes as long as a real model's: requests sent meanwhile queue up behind it
        return search_grouped(asked)

    service._batcher.run = counted
    with serving(create_app(service)) as url, httpx.Client(base_url=url, timeout=60) as client:

        def ask(question: str, **settings) -> dict:
            response = client.post("/search", json={"question": question, "top_k": 6, **settings})
            assert response.status_code == 200, response.text
            return without_timings(response.json())

        serial = {question: ask(question) for question in QUESTIONS}
        serial_bm25 = {question: ask(question, mode="bm25") for question in QUESTIONS}
        batch_sizes.clear()
        answers = ask_together(ask, QUESTIONS, rounds=3)
        mixed = ask_together(lambda q: ask(q, mode="bm25") if QUESTIONS.index(q) % 2 else ask(q), QUESTIONS, rounds=2)
    assert answers == [[serial[question]] * 3 for question in QUESTIONS]
    for position, (question, got) in enumerate(zip(QUESTIONS, mixed, strict=True)):
        assert got == [(serial_bm25 if position % 2 else serial)[question]] * 2
    assert max(batch_sizes) > 1 and sum(batch_sizes) == len(QUESTIONS) * 5
