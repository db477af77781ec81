"""Labelled text pairs for the encoders: MQP question pairs, the MedQuAD question-answer intermediate task, and the
query -> FAQ reranker task (Quebec COVID train queries, RQE positives, MeQSum CHQ -> FAQ) with mined hard negatives.

The Quebec train queries are split once, deterministically, by :func:`quebec_query_split`: the held-out part (20 %)
never enters reranker training and is the part the retrieval benchmark tests on.
"""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from index.collections import iter_jsonl, load_collection
from index.pair_sources import dataset_file, load_jsonl_rows, load_mqp
from index.runtime import MedfaqError
from retriever.encoder_training import EncoderTrainConfig, subsample

Encode = Callable[[list[str]], np.ndarray]
"""Texts -> (n, dim) unit-norm vectors, e.g. ``index.encoder.Encoder(name).encode``."""

QUEBEC_HELDOUT_FRACTION = 0.2
FAQ_SOURCES = ("quebec", "rqe", "meqsum")


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


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


# --- MQP -----------------------------------------------------------------------------------------------------------


def mqp_pairs(data_root: Path | None = None) -> list[Pair]:
    """The 3,048 MQP pairs; group = the `question_1` group, author = the doctor."""
    return [
        Pair(row["question_1"], row["question_2"], row["label"], f"mqp-{row['group_id']}", row["dr_id"], "mqp")
        for row in load_mqp(data_root)
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
    digest = hashlib.sha256(f"{seed}:{normalise(question)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


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
    queries: list[str], positives: list[str | None], pool: list[str], encode: Encode, n_negatives: int
) -> list[list[str]]:
    """For each query, the `n_negatives` pool texts most similar to it (by `encode`), skipping its positive."""
    if not queries:
        return []
    unique_pool = list(dict.fromkeys(pool))
    query_vectors, pool_vectors = encode(queries), encode(unique_pool)
    depth = min(len(unique_pool), n_negatives + 1)
    top = np.argsort(-(query_vectors @ pool_vectors.T), axis=1)[:, :depth]
    groups = []
    for positive, row in zip(positives, top, strict=True):
        skip = normalise(positive) if positive else None
        groups.append([unique_pool[j] for j in row if normalise(unique_pool[j]) != skip][:n_negatives])
    return groups


def _query_source(source: str, data_root: Path | None) -> tuple[list[tuple[str, str | None]], list[str]]:
    """(query, positive FAQ or None for an out-of-domain query) of one source's training split, and its FAQ pool."""
    if source == "quebec":
        records, _ = load_collection(dataset_file("quebec", "faqs.jsonl", data_root), format="quebec")
        faq_of = {record.id: record.question for record in records}
        train, _ = quebec_query_split(seed=0, data_root=data_root)  # always the benchmark's split
        queries = [
            (row["question"], None if row["is_ood"] else faq_of[str(row["passage_id"])])
            for row in train
            if row["is_ood"] or str(row["passage_id"]) in faq_of
        ]
        return queries, list(faq_of.values())
    if source == "rqe":
        rows = [row for row in load_jsonl_rows("rqe", "train.jsonl", data_root) if int(row["label"]) == 1]
        return [(row["chq"], row["faq"]) for row in rows], [row["faq"] for row in rows]
    if source == "meqsum":
        rows = load_jsonl_rows("meqsum", "train.jsonl", data_root)
        return [(row["chq"], row["faq"]) for row in rows], [row["faq"] for row in rows]
    raise MedfaqError(f"unknown FAQ source {source!r}; choose from {', '.join(FAQ_SOURCES)}")


def faq_pairs(
    encode: Encode,
    sources: Sequence[str] = FAQ_SOURCES,
    n_negatives: int = 3,
    max_queries: int | None = None,
    seed: int = 0,
    data_root: Path | None = None,
) -> list[Pair]:
    """Query -> FAQ pairs from the training splits of `sources`: (query, its FAQ) = 1 and (query, each of
    `n_negatives` FAQs of the same collection mined by `encode`) = 0. Out-of-domain Quebec queries get negatives
    only. At most `max_queries` queries: a seeded uniform sample of all sources' queries together, so each source
    contributes in proportion to its size."""
    loaded = {source: _query_source(source, data_root) for source in sources}
    tagged = [(source, i) for source, (queries, _) in loaded.items() for i in range(len(queries))]
    random.Random(seed).shuffle(tagged)
    chosen = sorted(tagged[:max_queries] if max_queries else tagged)
    pairs: list[Pair] = []
    for source, (queries, pool) in loaded.items():
        picked = [queries[i] for s, i in chosen if s == source]
        texts = [query for query, _ in picked]
        negatives = mine_hard_negatives(texts, [faq for _, faq in picked], pool, encode, n_negatives)
        for i, ((query, faq), mined) in enumerate(zip(picked, negatives, strict=True)):
            group = f"{source}-{i}"
            if faq is not None:
                pairs.append(Pair(query, faq, 1, group, source=source))
            pairs.extend(Pair(query, negative, 0, group, source=source) for negative in mined)
    return pairs


def task_pairs(config: EncoderTrainConfig, data_root: Path | None = None) -> list[Pair]:
    """All training pairs of `config.task` (seeded sample of at most `config.max_pairs`)."""
    if config.task == "mqp":
        pairs = mqp_pairs(data_root)
    elif config.task == "qa":
        pairs = qa_pairs(config.seed, config.qa_include_rqe, data_root)
    else:
        from index.encoder import Encoder

        encoder = Encoder(config.negatives_encoder)
        max_queries = config.max_pairs // (1 + config.faq_negatives) if config.max_pairs else None
        pairs = faq_pairs(encoder.encode, config.faq_sources, config.faq_negatives, max_queries, config.seed, data_root)
    return subsample(pairs, config.max_pairs, config.seed)


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
