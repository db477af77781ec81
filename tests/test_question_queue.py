"""The experts' queue (retriever/queue/question_queue.py): grouping by the duplicate detector, an expert's edits, and
answering a group once so that its questions find their FAQ first."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from medfaq.common.runtime import MedfaqError
from medfaq.index.faq_index import FaqIndex
from medfaq.retriever.queue.question_queue import SCHEMA, GroupingSettings, QuestionQueue, UnknownGroup

ASKED = {
    "alcohol": [
        "can i drink beer on amoxicillin",
        "is beer ok with amoxicillin",
        "amoxicillin and beer together ok",
    ],
    "knees": ["my knees hurt after running", "running makes my knees hurt"],
    "zorp": ["what is zorp fever"],
}


class SharedWords:
    """A duplicate detector for tests: the share of content words two questions have in common."""

    decision_boundary = 0.2  # the score from which two questions are the same

    def score(self, query: str, candidates: list[str]) -> list[float]:
        words = set(query.lower().replace("?", "").split())
        return [len(words & set(c.lower().split())) / len(words | set(c.lower().split())) for c in candidates]


class FirstWords:
    """A summarizer for tests: 'Q: ' and the first three words."""

    def rewrite(self, texts: list[str]) -> list[str]:
        return ["Q: " + " ".join(text.split()[:3]) for text in texts]


GROUP_BY_DETECTOR = GroupingSettings(floor=-1.0)  # the tiny random encoder's cosines mean nothing


@pytest.fixture
def index_dir(tmp_path, faq_records, tiny_encoder):
    FaqIndex.build(faq_records, tiny_encoder, progress=False).save(tmp_path / "idx")
    return tmp_path / "idx"


def queue_of(index_dir, encoder) -> QuestionQueue:
    """The queue of the index in `index_dir`, in the store every test index shares."""
    path = index_dir.parent / "queue.sqlite3"
    return QuestionQueue(path, encoder, SharedWords(), FirstWords(), GROUP_BY_DETECTOR, index_dir=index_dir)


@pytest.fixture
def queue(index_dir, tiny_encoder):
    return queue_of(index_dir, tiny_encoder)


def fill(queue: QuestionQueue) -> dict[str, int]:
    """Queue every question of `ASKED`, interleaved; the group of each topic."""
    groups = {}
    for round_ in range(3):
        for topic, questions in ASKED.items():
            if round_ < len(questions):
                groups.setdefault(topic, queue.add(questions[round_]).group_id)
    return groups


def test_the_same_question_asked_differently_forms_one_group_titled_by_the_summarizer(queue):
    groups = fill(queue)
    waiting = queue.groups()
    assert [(group.id, group.count) for group in waiting] == [
        (groups["alcohol"], 3),
        (groups["knees"], 2),
        (groups["zorp"], 1),
    ]
    assert {q.text for q in waiting[0].questions} == set(ASKED["alcohol"])
    assert waiting[0].title == "Q: can i drink"
    shown = waiting[0].to_dict()
    assert shown["count"] == 3 and shown["first_asked"] <= shown["last_asked"]
    with pytest.raises(MedfaqError, match="empty question"):
        queue.add("   ")


def test_without_a_detector_the_cosine_decides(tmp_path, tiny_encoder):
    settings = GroupingSettings(same_cosine=0.9999)
    queue = QuestionQueue(tmp_path / "q.sqlite3", tiny_encoder, settings=settings, index_dir=tmp_path / "idx")
    first = queue.add("is beer ok with amoxicillin")
    assert queue.add("is  beer ok with amoxicillin").group_id == first.group_id  # the same text
    assert queue.add("what is zorp fever").group_id != first.group_id


@pytest.mark.parametrize("titler", [FirstWords(), None])
def test_after_a_split_each_group_is_titled_from_its_own_questions(index_dir, tiny_encoder, titler):
    def title(text: str) -> str:
        return titler.rewrite([text])[0] if titler else text

    queue = QuestionQueue(
        index_dir.parent / "q.sqlite3", tiny_encoder, SharedWords(), titler, GROUP_BY_DETECTOR, index_dir=index_dir
    )
    alcohol = queue.group(fill(queue)["alcohol"])
    assert alcohol.title == title(ASKED["alcohol"][0])
    moved = queue.split(alcohol.id, [alcohol.questions[0].id])  # the question the group was titled from
    assert moved.title == title(ASKED["alcohol"][0])
    stayed = queue.group(alcohol.id)
    assert stayed.title == title(stayed.questions[0].text) == title(ASKED["alcohol"][1])


def test_split_and_merge(queue):
    groups = fill(queue)
    alcohol = queue.group(groups["alcohol"])
    split = queue.split(alcohol.id, [alcohol.questions[-1].id])
    assert split.count == 1 and queue.group(alcohol.id).count == 2 and split.title.startswith("Q: ")
    merged = queue.merge([alcohol.id, split.id])
    assert merged.count == 3 and split.id not in {group.id for group in queue.groups()}
    with pytest.raises(MedfaqError, match="some, not all"):
        queue.split(alcohol.id, [q.id for q in merged.questions])
    with pytest.raises(MedfaqError, match="no group 999"):
        queue.merge([alcohol.id, 999])


def top_hit(index_dir, encoder, question: str) -> str:
    return FaqIndex.load(index_dir, encoder).search_dense([question], 1)[0][0][0]


def test_a_linked_group_finds_its_faq_first_and_can_be_undone(queue, index_dir, tiny_encoder):
    groups = fill(queue)
    linked = queue.link(groups["alcohol"], "f1", by="dr a")
    assert (linked.status, linked.faq_id, linked.resolved_by) == ("linked", "f1", "dr a")
    assert linked.index_version == FaqIndex.load(index_dir).version
    assert all(top_hit(index_dir, tiny_encoder, q) == "f1" for q in ASKED["alcohol"])
    assert groups["alcohol"] not in {group.id for group in queue.groups()}
    assert queue.add(ASKED["alcohol"][0]).group_id != groups["alcohol"]  # a resolved group takes no new questions
    with pytest.raises(MedfaqError, match="already linked"):
        queue.link(groups["alcohol"], "f2")
    assert queue.undo(groups["alcohol"]).status == "waiting"
    assert FaqIndex.load(index_dir).phrasings() == []


def test_an_answered_group_becomes_a_new_faq(queue, index_dir, tiny_encoder):
    groups = fill(queue)
    answered = queue.answer(groups["zorp"], "What is zorp fever?", "A made-up illness.", by="dr b")
    assert (answered.status, answered.faq_id) == ("answered", f"expert-{groups['zorp']}")
    index = FaqIndex.load(index_dir)
    assert index.get(answered.faq_id).source == "expert"
    assert top_hit(index_dir, tiny_encoder, ASKED["zorp"][0]) == answered.faq_id
    with pytest.raises(MedfaqError, match="question and an answer"):
        queue.answer(groups["knees"], "Why do knees hurt?", " ")
    queue.undo(groups["zorp"])
    assert answered.faq_id not in FaqIndex.load(index_dir)
    with pytest.raises(MedfaqError, match="nothing to undo"):
        queue.undo(groups["zorp"])


def test_two_writers_asking_at_once_open_one_group(tmp_path, tiny_encoder):
    """Two queue objects on one file, as two processes have: the group is decided inside one write transaction."""
    path = tmp_path / "queue.sqlite3"
    writers = [
        QuestionQueue(path, tiny_encoder, SharedWords(), settings=GROUP_BY_DETECTOR, index_dir=tmp_path / "idx")
        for _ in "ab"
    ]
    start = threading.Barrier(len(writers))
    found = []

    def ask(queue: QuestionQueue) -> None:
        start.wait(timeout=30)
        found.append(queue.add("is beer ok with amoxicillin").group_id)

    threads = [threading.Thread(target=ask, args=(queue,)) for queue in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(found) == 2 and found[0] == found[1]
    assert [group.count for group in writers[0].groups()] == [2]


def test_sync_queues_each_logged_question_once(queue, tmp_path):
    from medfaq.retriever.queue.unanswered import UnansweredLog

    log = UnansweredLog(tmp_path / "unanswered.jsonl")
    for question in ASKED["alcohol"][:2]:
        log.append(question, None, [], 0.1)
    assert queue.sync(log.path) == 2 and queue.sync(log.path) == 0
    log.append(ASKED["knees"][0], None, [], 0.2)
    with log.path.open("a", encoding="utf-8") as handle:
        handle.write('{"query": "half a line')  # still being written
    assert queue.sync(log.path) == 1
    assert sorted(group.count for group in queue.groups()) == [1, 2]
    assert queue.sync(tmp_path / "absent.jsonl") == 0
    with pytest.raises(MedfaqError, match="without an unanswered log"):
        queue.sync()


def test_grouping_measures_on_a_known_grouping():
    from medfaq.eval.queue_grouping import best_threshold, grouping_report

    report = grouping_report(groups=[1, 1, 2, 2, 3], labels=[7, 7, 7, 8, 8])
    assert report["groups"] == 3 and report["faqs"] == 2
    assert report["purity"] == pytest.approx(4 / 5) and report["inverse_purity"] == pytest.approx(3 / 5)
    # same-group pairs: (0,1), (2,3); same-FAQ pairs: (0,1), (0,2), (1,2), (3,4); shared: (0,1)
    assert report["pairwise_precision"] == pytest.approx(1 / 2) and report["pairwise_recall"] == pytest.approx(1 / 4)
    scores = np.array([0.9, 0.8, 0.7, 0.2, 0.1])
    assert best_threshold(scores, np.array([True, True, True, False, False])) == pytest.approx(0.7)


def test_expert_links_and_feedback_become_training_pairs_with_a_held_back_slice(index_dir, tiny_encoder):
    from medfaq.retriever.queue.feedback import Feedback, FeedbackStore
    from medfaq.retriever.queue.question_queue import queue_beside
    from medfaq.retriever.queue.unanswered import UnansweredLog
    from medfaq.retriever.training.pair_data import expert_links, faq_pairs

    path = queue_beside(UnansweredLog().path)
    queue = QuestionQueue(path, tiny_encoder, SharedWords(), settings=GroupingSettings(), index_dir=index_dir)
    asked = [f"zzqx{n} blorf{n} wibble{n}" for n in range(40)]  # no words shared: 40 groups
    for question in asked:
        queue.link(queue.add(question).group_id, "f4")
    store = FeedbackStore()
    store.add(Feedback(session="s", question="does beer mix with amoxicillin", helpful=True, hit_ids=["f1"]))
    store.add(Feedback(session="s", question="what causes my migraines", helpful=False, hit_ids=["f3"]))

    trained, held_back = expert_links(index_dir), expert_links(index_dir, held_back=True)
    assert sorted(trained + held_back) == sorted((question, "f4") for question in asked)
    assert 0 < len(held_back) < len(trained)  # a fifth, give or take, kept out to measure what training learned
    pairs = faq_pairs(tiny_encoder.encode, sources=(), n_negatives=2, feedback_index=index_dir)
    found = {(p.text_a, p.text_b, p.label) for p in pairs}
    assert {(q, "Is Parkinson's disease inherited?", 1) for q, _ in trained} <= found
    assert not {q for q, _ in held_back} & {p.text_a for p in pairs}
    assert ("does beer mix with amoxicillin", "Can I drink alcohol while taking amoxicillin?", 1) in found
    assert ("what causes my migraines", "How is shingles treated?", 0) in found
    assert {p.source for p in pairs} == {"feedback"}


def test_each_index_has_its_own_queue_and_a_copy_is_another_index(queue, index_dir, tiny_encoder):
    import shutil

    copy = shutil.copytree(index_dir, index_dir.parent / "idx3")
    other = queue_of(copy, tiny_encoder)
    mine, theirs = queue.add(ASKED["alcohol"][0]).group_id, other.add(ASKED["alcohol"][1]).group_id
    assert mine != theirs  # the same question, asked of two indexes: a group in each queue
    assert [g.id for g in queue.groups()] == [mine] and [g.id for g in other.groups()] == [theirs]
    with pytest.raises(UnknownGroup, match=f"group {theirs} belongs to another index"):
        queue.merge([mine, theirs])
    queue.link(mine, "f1")
    other.link(theirs, "f2")
    for action in (lambda: queue.undo(theirs), lambda: queue.link(theirs, "f3"), lambda: queue.split(theirs, [1])):
        with pytest.raises(UnknownGroup, match=f"group {theirs} belongs to another index"):
            action()
    assert [p.faq_id for p in FaqIndex.load(index_dir).phrasings()] == ["f1"]  # the copy's undo removed nothing here
    assert queue.undo(mine).status == "waiting" and other.undo(theirs).status == "waiting"
    assert FaqIndex.load(index_dir).phrasings() == [] and FaqIndex.load(copy).phrasings() == []


def test_undo_removes_only_the_phrasings_the_group_added(queue, index_dir, faq_records, tiny_encoder):
    group = queue.link(fill(queue)["knees"], "f2")
    FaqIndex.build(faq_records, tiny_encoder, progress=False).save(index_dir)  # rebuilt: its keys start again
    FaqIndex.edit(
        index_dir, lambda index: index.editor().add_phrasings("f2", ASKED["knees"], "dr c", "by hand"), tiny_encoder
    )
    queue.undo(group.id)
    assert {(p.text, p.origin) for p in FaqIndex.load(index_dir).phrasings()} == {
        (q, "by hand") for q in ASKED["knees"]
    }


def test_an_answer_other_groups_link_to_is_not_undone(queue, index_dir):
    groups = fill(queue)
    faq_id = queue.answer(groups["zorp"], "What is zorp fever?", "A made-up illness.").faq_id
    queue.link(groups["knees"], faq_id)
    with pytest.raises(MedfaqError, match=f"also holds phrasings of queue group {groups['knees']}: undo those first"):
        queue.undo(groups["zorp"])
    assert faq_id in FaqIndex.load(index_dir) and queue.group(groups["zorp"]).status == "answered"
    queue.undo(groups["knees"])
    queue.undo(groups["zorp"])
    assert faq_id not in FaqIndex.load(index_dir)


def test_a_store_of_before_the_queue_was_per_index_belongs_to_the_first_index_opening_it(
    index_dir, tmp_path, tiny_encoder
):
    import sqlite3

    from medfaq.retriever.queue.unanswered import UnansweredLog

    store = tmp_path / "queue.sqlite3"
    schema = SCHEMA.replace("    undo TEXT,\n    index_dir TEXT\n", "    undo TEXT\n")
    log = UnansweredLog(tmp_path / "unanswered.jsonl")
    log.append("what is zorp fever", None, [], 0.1)
    with sqlite3.connect(store) as db:
        db.executescript(schema)
        db.execute("INSERT INTO groups (title, created) VALUES ('old', '2024-01-01')")
        vector = np.asarray(tiny_encoder.encode(["old"])[0], dtype=np.float32).tobytes()
        db.execute(
            "INSERT INTO questions (text, asked, source, group_id, vector) VALUES ('old', '', 'x', 1, ?)", (vector,)
        )
        position = {"path": str(log.path.resolve()), "inode": log.path.stat().st_ino, "offset": 0}
        db.execute("INSERT INTO meta VALUES ('log', ?)", (json.dumps(position),))
    elsewhere = (tmp_path / "elsewhere").resolve()
    log.append("a new question", None, [], 0.1, index=str(elsewhere))
    first, later = queue_of(index_dir, tiny_encoder), queue_of(elsewhere, tiny_encoder)
    assert [g.title for g in first.groups()] == ["old"] and later.groups() == []
    assert first.sync(log.path) == 1 and later.sync(log.path) == 1  # logged without an index: the first index's
    assert {g.title for g in first.groups()} == {"old", "Q: what is zorp"}
    assert [g.title for g in later.groups()] == ["Q: a new question"]
