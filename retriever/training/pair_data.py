"""Labelled text pairs for the encoders: MQP question pairs, the MedQuAD question-answer intermediate task, and the
query -> FAQ task of the reranker and the retrieval bi-encoder (training splits of MeQSum, HealthCareMagic, CHQ-Summ,
RQE, MQP and the Quebec COVID queries) with mined hard negatives, false negatives removed.

The Quebec train queries are split once, deterministically, by :func:`quebec_query_split`: the held-out part (20 %)
never enters reranker training and is the part the retrieval benchmark tests on.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from medfaq.common.runtime import MedfaqError
from medfaq.index.collections import iter_jsonl, load_collection
from medfaq.index.concepts import ConceptLexicon, concept_lexicon, read_with_concepts
from medfaq.index.datasets import DATASETS, FAQ_SOURCES, HELD_OUT_SPLITS, OPTIONAL_FAQ_SOURCES
from medfaq.index.pair_sources import dataset_file, load_jsonl_rows, load_mqp
from medfaq.retriever.training.config import EncoderTrainConfig

logger = logging.getLogger("medfaq.training")

T = TypeVar("T")

Encode = Callable[[list[str]], np.ndarray]
"""Texts -> (n, dim) unit-norm vectors, e.g. ``index.encoder.Encoder(name).encode``."""

QUEBEC_HELDOUT_FRACTION = 0.2
SUMMARY_SOURCES = tuple(
    name for name in FAQ_SOURCES if DATASETS[name].summary_splits and not DATASETS[name].positive_only
)  # CHQ -> its FAQ-style summary
EXPERT_HELDOUT_FRACTION = 0.2  # of the experts' queue groups, kept out of training to measure what it learned
MEDQUAD_ANSWER_CHARS = 600
NEAR_DUPLICATE = 0.9  # cosine to the positive at or above which a mined negative counts as a false negative


@dataclass(frozen=True)
class Pair:
    """Two texts and a 0/1 label. `group` keeps related pairs (same MQP `question_1`, same query) in one split;
    `author` is who wrote the pair (the MQP doctor)."""

    text_a: str
    text_b: str
    label: int
    group: str = ""
    author: str = ""
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def subsample(items: Sequence[T], limit: int | None, seed: int) -> list[T]:
    """`items` in a seeded random order, at most `limit` of them."""
    order = list(items)
    random.Random(seed).shuffle(order)
    return order[:limit] if limit else order


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


# --- MQP -----------------------------------------------------------------------------------------------------------


def mqp_pairs(data_root: Path | None = None) -> list[Pair]:
    """The 3,048 MQP pairs; group = the `question_1` group, author = the doctor."""
    return [
        Pair(row["question_1"], row["question_2"], row["label"], f"mqp-{row['group_id']}", row["dr_id"], "mqp")
        for row in load_mqp(data_root)
    ]


def mqp_sibling_negatives(pairs: Sequence[Pair]) -> list[Pair]:
    """One more negative per MQP group holding a positive and a negative pair: its two rewrites of the same
    question, the similar one against the dissimilar one (a doctor wrote them to differ in what is asked)."""
    rewrites: dict[str, dict[int, Pair]] = {}
    for pair in pairs:
        rewrites.setdefault(pair.group, {})[pair.label] = pair
    return [
        Pair(both[1].text_b, both[0].text_b, 0, group, both[1].author, "mqp-sibling")
        for group, both in rewrites.items()
        if set(both) == {0, 1}
    ]


# --- intermediate task: MedQuAD question -> answer -----------------------------------------------------------------


def qa_pairs(seed: int = 0, include_rqe: bool = False, data_root: Path | None = None) -> list[Pair]:
    """MedQuAD rows with an answer: (question, own answer) = 1 and (question, a random answer of the same focus
    category, else the same question type, about another focus) = 0; optionally plus the RQE train pairs."""
    records, _ = load_collection(dataset_file("medquad", "medquad.jsonl", data_root), format="medquad")
    answered = [record for record in records if record.answer.strip()]
    by_kind: dict[str, list[int]] = defaultdict(list)
    kinds = []
    for i, record in enumerate(answered):
        kind = record.metadata.get("focus_category") or f"qtype:{record.metadata.get('qtype', '')}"
        kinds.append(kind)
        by_kind[kind].append(i)
    rng = random.Random(seed)
    pairs = []
    for i, record in enumerate(answered):
        group = f"medquad-{record.metadata.get('doc_id', record.id)}"
        pairs.append(Pair(record.question, record.answer, 1, group, source="medquad"))
        focus = record.metadata.get("focus")
        for _ in range(10):  # a few tries to find another focus; rare kinds may have none
            other = answered[rng.choice(by_kind[kinds[i]])]
            if other.metadata.get("focus") != focus:
                pairs.append(Pair(record.question, other.answer, 0, group, source="medquad"))
                break
    if include_rqe:
        pairs.extend(rqe_pairs("train", data_root))
    return pairs


def rqe_pairs(split: str = "train", data_root: Path | None = None) -> list[Pair]:
    """RQE (question entailment) pairs of one split, both labels."""
    return [
        Pair(row["chq"], row["faq"], int(row["label"]), f"rqe-{row['pid']}", source="rqe")
        for row in load_jsonl_rows("rqe", f"{split}.jsonl", data_root)
    ]


# --- reranker task: query -> FAQ -----------------------------------------------------------------------------------


def is_heldout(question: str, seed: int = 0, fraction: float = QUEBEC_HELDOUT_FRACTION) -> bool:
    """Deterministic membership of the held-out part: a hash of (`seed`, normalised question text).

    Hashing the text rather than the query id keeps repeated query strings on one side of the split."""
    return hashed_position(question, seed) < fraction


def hashed_position(text: str, seed: int = 0) -> float:
    """A seeded position in [0, 1) for `text` (normalised): the same text always falls in the same part of a split."""
    digest = hashlib.sha256(f"{seed}:{normalise(text)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def quebec_query_split(
    seed: int = 0, fraction: float = QUEBEC_HELDOUT_FRACTION, data_root: Path | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training queries, held-out queries) of the Quebec COVID ``train.jsonl`` (rows: id, question, passage_id,
    is_ood, source). About `fraction` of the queries, in-domain and out-of-domain alike, are held out."""
    rows = load_jsonl_rows("quebec", "train.jsonl", data_root)
    train = [row for row in rows if not is_heldout(row["question"], seed, fraction)]
    heldout = [row for row in rows if is_heldout(row["question"], seed, fraction)]
    return train, heldout


def mine_hard_negatives(
    queries: list[str],
    positives: list[str | None],
    pool: list[str],
    encode: Encode,
    n_negatives: int,
    near_duplicate: float = NEAR_DUPLICATE,
) -> list[list[str]]:
    """For each query, the `n_negatives` pool texts most similar to it (by `encode`), without false negatives: the
    positive itself (same normalised text) and near-duplicates of it (cosine to the positive >= `near_duplicate`)."""
    if not queries:
        return []
    unique_pool = list(dict.fromkeys(pool))
    query_vectors, pool_vectors = encode(queries), encode(unique_pool)
    positive_vectors = dict(zip(unique_pool, pool_vectors, strict=True))  # positives are mostly pool texts
    outside = list(dict.fromkeys(p for p in positives if p and p not in positive_vectors))
    if outside:
        positive_vectors.update(zip(outside, encode(outside), strict=True))
    depth = min(len(unique_pool), 4 * n_negatives + 8)
    top = np.argsort(-(query_vectors @ pool_vectors.T), axis=1)[:, :depth]
    groups = []
    for positive, row in zip(positives, top, strict=True):
        skip = normalise(positive) if positive else None
        similar = pool_vectors[row] @ positive_vectors[positive] if positive else np.zeros(len(row))
        kept = [unique_pool[j] for j, s in zip(row, similar, strict=True) if s < near_duplicate]
        groups.append([text for text in kept if normalise(text) != skip][:n_negatives])
    return groups


def retrieval_near_misses(
    index_dir: str | Path | Any,
    pairs: Sequence[tuple[str, str]],
    n_negatives: int,
    near_duplicate: float = NEAR_DUPLICATE,
) -> list[dict[str, Any]]:
    """For each (CHQ, FAQ) pair, the `n_negatives` FAQ questions of the index in `index_dir` that its dense search
    ranks highest for the CHQ, false negatives removed as in :func:`mine_hard_negatives` (the FAQ itself, and
    questions within `near_duplicate` cosine of it): ``{"chq", "negatives"}`` rows, the summarizer's retrieval
    negatives (``medfaq train summarizer --retrieval-negatives``); `index_dir` may be a loaded index."""
    from medfaq.index.faq_index import FaqIndex

    index = index_dir if isinstance(index_dir, FaqIndex) else FaqIndex.load(index_dir)
    chqs = list(dict.fromkeys(chq for chq, _ in pairs))
    faq_of = dict(pairs)
    found = index.search_dense(chqs, 4 * n_negatives + 8)
    questions = [[index.get(faq_id).question for faq_id, _ in row] for row in found]
    texts = list(dict.fromkeys([*faq_of.values(), *(text for row in questions for text in row)]))
    vectors = dict(zip(texts, index.encoder.encode(texts), strict=True))
    rows = []
    for chq, candidates in zip(chqs, questions, strict=True):
        faq = faq_of[chq]
        kept = [
            text
            for text in dict.fromkeys(candidates)
            if normalise(text) != normalise(faq) and float(vectors[text] @ vectors[faq]) < near_duplicate
        ]
        rows.append({"chq": chq, "negatives": kept[:n_negatives]})
    return rows


@dataclass
class QuerySet:
    """One source's training queries as (query, positive or None for an out-of-scope query, labelled negatives),
    and the texts hard negatives are mined from."""

    items: list[tuple[str, str | None, tuple[str, ...]]]
    pool: list[str]


def _by_query(rows: Sequence[tuple[str, str, int]]) -> QuerySet:
    """(query, candidate, label) rows -> one item per positive, carrying the query's labelled negatives; queries with
    negatives only become out-of-scope items."""
    positives: dict[str, list[str]] = defaultdict(list)
    negatives: dict[str, list[str]] = defaultdict(list)
    for query, candidate, label in rows:
        (positives if label == 1 else negatives)[query].append(candidate)
    items = [(q, p, tuple(negatives[q])) for q in dict.fromkeys(q for q, _, _ in rows) for p in positives[q] or [None]]
    return QuerySet(items, [candidate for _, candidate, _ in rows])


def query_source(source: str, data_root: Path | None) -> QuerySet:
    """The training split of one FAQ source (see `FAQ_SOURCES`)."""
    if source in SUMMARY_SOURCES:
        rows = load_jsonl_rows(source, "train.jsonl", data_root)
        return QuerySet([(row["chq"], row["faq"], ()) for row in rows], [row["faq"] for row in rows])
    if source == "rqe":
        rows = load_jsonl_rows("rqe", "train.jsonl", data_root)
        return _by_query([(row["chq"], row["faq"], int(row["label"])) for row in rows])
    if source == "mqp":
        return _by_query([(row["question_1"], row["question_2"], row["label"]) for row in load_mqp(data_root)])
    if source == "quebec":
        records, _ = load_collection(dataset_file("quebec", "faqs.jsonl", data_root), format="quebec")
        faq_of = {record.id: record.question for record in records}
        train, _ = quebec_query_split(seed=0, data_root=data_root)  # always the benchmark's split
        items = [
            (row["question"], None if row["is_ood"] else faq_of[str(row["passage_id"])], ())
            for row in train
            if row["is_ood"] or str(row["passage_id"]) in faq_of
        ]
        return QuerySet(items, list(faq_of.values()))
    if source == "medquad":
        records, _ = load_collection(dataset_file("medquad", "medquad.jsonl", data_root), format="medquad")
        answered = [record for record in records if record.answer.strip()]
        answers = [record.answer[:MEDQUAD_ANSWER_CHARS] for record in answered]
        return QuerySet([(r.question, a, ()) for r, a in zip(answered, answers, strict=True)], answers)
    raise MedfaqError(f"unknown FAQ source {source!r}; choose from {', '.join(FAQ_SOURCES + OPTIONAL_FAQ_SOURCES)}")


def heldout_texts(data_root: Path | None = None) -> set[str]:
    """Normalised questions of every benchmark's evaluation split (MeQSum valid/test, RQE valid/test, MEDIQA 2021,
    the Quebec held-out queries): no training pair may contain one. Data sets not fetched are skipped."""
    texts: set[str] = set()
    for name, split in HELD_OUT_SPLITS:
        try:
            texts.update(normalise(row["chq"]) for row in load_jsonl_rows(name, f"{split}.jsonl", data_root))
        except MedfaqError:
            logger.info("%s %s not fetched: not checked against the training pairs", name, split)
    try:
        texts.update(normalise(row["question"]) for row in quebec_query_split(data_root=data_root)[1])
    except MedfaqError:
        logger.info("quebec not fetched: not checked against the training pairs")
    return texts


def expert_links(index_dir: str | Path, seed: int = 0, held_back: bool = False) -> list[tuple[str, str]]:
    """(question, FAQ id) of every question an expert linked or answered in the experts' queue of the index in
    `index_dir` (retriever/queue/question_queue.py), FAQs since deleted left out. A seeded `EXPERT_HELDOUT_FRACTION`
    of the groups (by their first question) is held back for evaluation: those with `held_back`, the others without."""
    from medfaq.retriever.pipeline_file import read_config
    from medfaq.retriever.queue.question_queue import QuestionQueue, queue_beside
    from medfaq.retriever.queue.unanswered import UnansweredLog

    log = UnansweredLog(read_config(index_dir).unanswered_log).path
    if not queue_beside(log).is_file():
        return []
    links = []
    for group in QuestionQueue(queue_beside(log), index_dir=index_dir).groups(None):
        resolved = group.status != "waiting" and group.questions  # a resolved group keeps at least one question
        if resolved and is_heldout(group.questions[0].text, seed, EXPERT_HELDOUT_FRACTION) == held_back:
            links += [(question.text, group.faq_id) for question in group.questions]
    return links


def expert_query_set(index_dir: str | Path, seed: int = 0) -> QuerySet:
    """The experts' links (the training part of :func:`expert_links`) as positives, and the "Was this helpful?"
    answers about searches (retriever/queue/feedback.py): the FAQ a user found helpful as a positive, one found not
    helpful as a labelled negative; hard negatives are mined from the index's FAQ questions."""
    from medfaq.index.faq_index import FaqIndex
    from medfaq.retriever.queue.feedback import FeedbackStore, default_feedback_path

    index = FaqIndex.load(index_dir)
    items: list[tuple[str, str | None, tuple[str, ...]]] = [
        (question, index.get(faq_id).question, ())
        for question, faq_id in expert_links(index_dir, seed)
        if faq_id in index
    ]
    if default_feedback_path().is_file():
        for row in FeedbackStore().all():
            if row.hit_ids and row.hit_ids[0] in index and not is_heldout(row.question, seed, EXPERT_HELDOUT_FRACTION):
                faq = index.get(row.hit_ids[0]).question
                items.append((row.question, faq, ()) if row.helpful else (row.question, None, (faq,)))
    return QuerySet(items, [record.question for record in index.records()])


def faq_pairs(
    encode: Encode,
    sources: Sequence[str] = FAQ_SOURCES,
    n_negatives: int = 3,
    per_source: int | None = None,
    seed: int = 0,
    data_root: Path | None = None,
    feedback_index: str | Path | None = None,
) -> list[Pair]:
    """Query -> FAQ pairs from the training splits of `sources`: (query, its FAQ) = 1; (query, a labelled negative)
    and (query, each of `n_negatives` texts of the same source mined by `encode`, false negatives removed) = 0.
    Out-of-scope queries get negatives only. Each source gives at most `per_source` queries (a seeded sample), so no
    source dominates; a query that is a question of an evaluation split (:func:`heldout_texts`) is never used. With
    `feedback_index`, the experts' links and the search feedback about that index are one more source,
    ``feedback`` (:func:`expert_query_set`), all of it used."""
    heldout = heldout_texts(data_root)
    query_sets = [(source, query_source(source, data_root), per_source) for source in sources]  # (source, set, cap)
    if feedback_index is not None:
        query_sets.append(("feedback", expert_query_set(feedback_index, seed), None))
    pairs: list[Pair] = []
    for source, query_set, limit in query_sets:
        items = [item for item in query_set.items if normalise(item[0]) not in heldout]
        items = [item for item in items if not item[1] or normalise(item[1]) not in heldout]
        picked = sorted(subsample(range(len(items)), limit, seed))
        chosen = [items[i] for i in picked]
        mined = mine_hard_negatives(
            [query for query, _, _ in chosen],
            [positive for _, positive, _ in chosen],
            query_set.pool,
            encode,
            n_negatives,
        )
        positives_of: dict[str, set[str]] = defaultdict(set)  # a query's other positives are no negatives of it
        for query, positive, _ in query_set.items:
            if positive:
                positives_of[query].add(normalise(positive))
        for i, ((query, positive, labelled), negatives) in enumerate(zip(chosen, mined, strict=True)):
            group = f"{source}-{picked[i]}"
            if positive is not None:
                pairs.append(Pair(query, positive, 1, group, source=source))
            negatives = [text for text in negatives if normalise(text) not in positives_of[query]]
            negatives = list(dict.fromkeys([*labelled, *negatives]))[: max(n_negatives, len(labelled))]
            pairs.extend(Pair(query, negative, 0, group, source=source) for negative in negatives)
        logger.info("%s: %d of %d training queries used", source, len(chosen), len(query_set.items))
    return pairs


def ranking_groups(pairs: Sequence[Pair]) -> list[list[Pair]]:
    """The pairs of each query (same `group`) as ``[positive, *negatives]``, for a listwise loss; groups without a
    positive (out-of-scope queries) or without a negative are left out. `faq_pairs` gives each positive its own
    group, so every group has one positive."""
    by_group: dict[str, list[Pair]] = defaultdict(list)
    for pair in pairs:
        by_group[pair.group or pair.text_a].append(pair)
    groups = []
    for members in by_group.values():
        positives = [pair for pair in members if pair.label == 1]
        negatives = [pair for pair in members if pair.label == 0]
        if positives and negatives:
            groups.append([positives[0], *negatives])
    return groups


def pair_counts(pairs: Sequence[Pair]) -> dict[str, dict[str, int]]:
    """Per source: distinct queries, positive pairs and negative pairs."""
    counts: dict[str, dict[str, int]] = {}
    queries: dict[str, set[str]] = defaultdict(set)
    for pair in pairs:
        row = counts.setdefault(pair.source, {"queries": 0, "positives": 0, "negatives": 0})
        row["positives" if pair.label == 1 else "negatives"] += 1
        queries[pair.source].add(pair.text_a)
    for source, row in counts.items():
        row["queries"] = len(queries[source])
    return counts


def task_pairs(config: EncoderTrainConfig, data_root: Path | None = None) -> list[Pair]:
    """All training pairs of `config.task` (seeded sample of at most `config.max_pairs`)."""
    if config.task == "mqp":
        pairs = mqp_pairs(data_root)
    elif config.task == "qa":
        pairs = qa_pairs(config.seed, config.qa_include_rqe, data_root)
    else:
        from medfaq.index.encoder import Encoder

        encoder = Encoder(config.negatives_encoder)
        pairs = faq_pairs(
            partial(encoder.encode, progress=True),
            config.faq_sources,
            config.faq_negatives,
            config.faq_per_source,
            config.seed,
            data_root,
            config.feedback_index,
        )
        pairs = with_concepts(pairs, concept_lexicon(config.faq_synonyms))
    if config.loss == "listwise":  # whole queries: a group cut in two would lose its positive or its negatives
        return subsample_groups(pairs, config.max_pairs, config.seed)
    return subsample(pairs, config.max_pairs, config.seed)


def with_concepts(pairs: Sequence[Pair], lexicon: ConceptLexicon | None) -> list[Pair]:
    """`pairs` with each FAQ side (`text_b`) read as a reranker reads it over an index encoded with `lexicon`."""
    if lexicon is None:
        return list(pairs)
    return [replace(pair, text_b=read_with_concepts(lexicon, pair.text_b)) for pair in pairs]


def subsample_groups(pairs: Sequence[Pair], limit: int | None, seed: int) -> list[Pair]:
    """The pairs of whole groups (queries) in a seeded random order of the groups, stopping before `limit` pairs
    would be exceeded."""
    by_group: dict[str, list[Pair]] = defaultdict(list)
    for pair in pairs:
        by_group[pair.group or pair.text_a].append(pair)
    kept: list[Pair] = []
    for group in subsample(list(by_group), None, seed):
        if limit and len(kept) + len(by_group[group]) > limit:
            break
        kept.extend(by_group[group])
    return kept


# --- triplets for MultipleNegativesRankingLoss, pair files ---------------------------------------------------------


def mnrl_triplets(pairs: Sequence[Pair], encode: Encode | None = None) -> list[tuple[str, str, str]]:
    """(anchor, positive, hard negative) for every positive pair. The negative is a labelled negative of the same
    anchor when there is one, else the most similar other `text_b` mined with `encode`."""
    labelled: dict[str, list[str]] = defaultdict(list)
    for pair in pairs:
        if pair.label == 0:
            labelled[pair.text_a].append(pair.text_b)
    positives = [pair for pair in pairs if pair.label == 1]
    unmatched = [pair for pair in positives if not labelled[pair.text_a]]
    if unmatched:
        if encode is None:
            raise MedfaqError("mining hard negatives needs an encoder")
        pool = [pair.text_b for pair in pairs]
        mined = mine_hard_negatives([p.text_a for p in unmatched], [p.text_b for p in unmatched], pool, encode, 1)
        for pair, negatives in zip(unmatched, mined, strict=True):
            labelled[pair.text_a].extend(negatives)
    return [(p.text_a, p.text_b, labelled[p.text_a][0]) for p in positives if labelled[p.text_a]]


PAIR_FIELDS = (("text_a", "question_1", "query", "chq"), ("text_b", "question_2", "candidate", "faq"))


def read_pairs_file(path: str | Path) -> list[Pair]:
    """A labelled pairs JSONL file: per line two texts (``text_a``/``text_b``, or ``question_1``/``question_2``,
    ``query``/``candidate``, ``chq``/``faq``) and ``label`` 0/1; optional ``group`` and ``author``/``dr_id``."""
    path = Path(path)
    pairs = []
    for line_no, row in iter_jsonl(path):
        texts = [next((row[name] for name in names if isinstance(row.get(name), str)), None) for names in PAIR_FIELDS]
        if None in texts or row.get("label") not in (0, 1, "0", "1"):
            raise MedfaqError(f"{path}:{line_no}: expected two texts (text_a, text_b) and a label 0 or 1")
        author = str(row.get("author", row.get("dr_id", "")))
        pairs.append(Pair(texts[0], texts[1], int(row["label"]), str(row.get("group", "")), author, path.stem))
    if not pairs:
        raise MedfaqError(f"{path}: no pairs")
    return pairs
