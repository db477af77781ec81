"""Retrieval benchmarks in the BEIR layout, made from our datasets, and the standard files around them.

The benchmarks are declared with their datasets (index/datasets.py, `BenchmarkSpec`), each with its kind: a real FAQ
bank (``covid-q``, ``quebec``, ``medquad-rqe``: FAQs that exist apart from the questions, which consumers wrote; the
evidence for defaults) or a summary-matching set (the others: the corpus is made of, or seeded with, the test
questions' own reference summaries). Those with a query split are made by :func:`_pair_benchmark`, the others by their
own functions here.

A benchmark directory holds ``corpus.jsonl`` (``{"_id", "title", "text", "metadata"}``; `text` = the FAQ question),
``queries.jsonl`` (``{"_id", "text", "metadata": {"split", "ood"}}``), ``qrels.tsv`` (BEIR: ``query-id corpus-id
score`` with a header), the same judgements as TREC qrels (``qrels.trec``: ``qid 0 docid rel``), ``ood.txt`` and
``dev.txt`` (query ids, one a line) and ``benchmark.json`` (how it was made, counts).

* ``meqsum``: MeQSum test CHQs; corpus = every MeQSum FAQ (all splits); gold = the CHQ's own FAQ.
* ``mediqa2021``: MEDIQA 2021 test CHQs; corpus = every MEDIQA 2021 FAQ (valid + test); gold = its own FAQ.
* ``rqe-valid`` / ``rqe-test``: RQE CHQs of that split; corpus = every entailed FAQ of valid and test; gold = the
  FAQs the CHQ entails.
* ``quebec``: the Quebec COVID FAQ (313); queries = the held-out part of the train queries
  (:func:`retriever.training.pair_data.quebec_query_split`), halved by a second hash into ``dev`` (threshold
  calibration) and ``test``; the HealthTap questions among them are out of scope (``ood``: no qrels; they test
  abstention).
* ``covid-q``: the first question of each COVID-Q class is its FAQ, the class's other questions are its queries,
  halved by the same second hash as ``quebec`` into ``dev`` and ``test`` (the one bank no model here trains on, so
  its development half is the decisions' closest stand-in for a user's own bank).
* ``medquad-rqe``: the CHQs of RQE test and valid whose entailed FAQ is a MedQuAD question (:func:`question_key`),
  searched against all of MedQuAD as it is (nothing added; judged on every MedQuAD record with that question), halved
  by the same second hash as ``quebec`` into ``dev`` and ``test``. Made from the MedQuAD dataset; evaluated on a copy
  of a MedQuAD index (:func:`index_over_bank`, nothing to encode).

* ``medquad-chq``: long consumer questions against a bank of ~47k FAQs: the test CHQs of ``meqsum``,
  ``rqe-test`` and ``mediqa2021``, their gold FAQs added to the full MedQuAD collection (the bank index, default
  ``$MEDFAQ_HOME/indexes/medquad-minilm``), every MedQuAD FAQ a distractor. A gold FAQ whose text is already a
  MedQuAD question is judged on those MedQuAD entries instead of being added twice.

FAQ strings that occur more than once (case/space-normalised) become one corpus entry, so a duplicate never
counts as a miss. Query ids and corpus ids are stable across runs.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medfaq.common.ranking import Qrels, read_qrels, write_qrels
from medfaq.common.runtime import MedfaqError
from medfaq.index.collections import iter_jsonl, load_collection
from medfaq.index.datasets import BENCHMARK_KINDS, BENCHMARKS
from medfaq.index.records import FaqRecord

CHQ_PARTS = ("meqsum", "rqe-test", "mediqa2021")  # the CHQ sets of ``medquad-chq``
BANK_INDEX = "medquad-minilm"  # under indexes_dir(): the bank ``medquad-chq`` adds its gold FAQs to
OVER_BANK = ("medquad-chq", "medquad-rqe")  # indexed as a copy of the MedQuAD index (`index_over_bank`)
MEDQUAD_RQE_SPLITS = ("test", "valid")  # the RQE splits whose CHQs ``medquad-rqe`` asks
CORPUS_FIELDS = {"id": "_id", "question": "text", "answer": "answer"}
"""How `medfaq index build` reads a benchmark corpus: ``--field id=_id --field question=text --field answer=answer``
(every corpus row has an ``answer`` beside BEIR's fields: the FAQ's answer where its bank has one, else "")."""
DEV_SEED = 1  # second hash that halves a real bank's queries (Quebec's held-out ones, covid-q's, medquad-rqe's)


@dataclass
class Benchmark:
    """A corpus, queries and relevance judgements; queries may be marked ``dev`` or out of scope (``ood``)."""

    name: str
    corpus: list[dict[str, Any]]
    queries: list[dict[str, Any]]
    qrels: Qrels
    description: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ood_ids(self) -> set[str]:
        return {q["_id"] for q in self.queries if q.get("metadata", {}).get("ood")}

    @property
    def dev_ids(self) -> set[str]:
        return {q["_id"] for q in self.queries if q.get("metadata", {}).get("split") == "dev"}

    def query_texts(self) -> dict[str, str]:
        return {q["_id"]: q["text"] for q in self.queries}

    def counts(self) -> dict[str, int]:
        return {
            "corpus": len(self.corpus),
            "queries": len(self.queries),
            "judged_queries": len(self.qrels),
            "qrels": sum(len(v) for v in self.qrels.values()),
            "ood_queries": len(self.ood_ids),
            "dev_queries": len(self.dev_ids),
        }

    def save(self, directory: str | Path) -> Path:
        """Write the BEIR files (and TREC qrels, id lists, benchmark.json) into `directory`."""
        out = Path(directory).expanduser()
        out.mkdir(parents=True, exist_ok=True)
        _write_jsonl(out / "corpus.jsonl", [{**row, "answer": row.get("answer", "")} for row in self.corpus])
        _write_jsonl(out / "queries.jsonl", self.queries)
        write_qrels(out / "qrels.tsv", self.qrels)
        write_qrels(out / "qrels.trec", self.qrels, trec=True)
        (out / "ood.txt").write_text("".join(f"{q}\n" for q in sorted(self.ood_ids)), encoding="utf-8")
        (out / "dev.txt").write_text("".join(f"{q}\n" for q in sorted(self.dev_ids)), encoding="utf-8")
        info = {"name": self.name, "description": self.description, "counts": self.counts(), **self.info}
        (out / "benchmark.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        return out

    @classmethod
    def load(cls, directory: str | Path) -> Benchmark:
        path = Path(directory).expanduser()
        if not (path / "corpus.jsonl").is_file():
            raise MedfaqError(f"{path} is not a benchmark directory (no corpus.jsonl)")
        info_file = path / "benchmark.json"
        info = json.loads(info_file.read_text(encoding="utf-8")) if info_file.is_file() else {}
        return cls(
            name=info.get("name", path.name),
            corpus=[row for _, row in iter_jsonl(path / "corpus.jsonl")],
            queries=read_beir_queries(path / "queries.jsonl"),
            qrels=read_qrels(path / "qrels.tsv"),
            description=info.get("description", ""),
        )


# ---- standard files -------------------------------------------------------------------------------------------------


def read_beir_queries(path: str | Path) -> list[dict[str, Any]]:
    """Queries as BEIR rows ``{"_id", "text", "metadata"}``; medfaq's ``{"id", "question"}`` lines are accepted too.
    A missing id or text, an empty text or a repeated id is a one-line error naming the line."""
    path = Path(path)
    rows: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for line_no, row in iter_jsonl(path):
        query_id = row.get("_id", row.get("id"))
        text = row.get("text", row.get("question"))
        if query_id is None or not isinstance(text, str) or not text.strip():
            raise MedfaqError(f"{path}:{line_no}: expected a query with '_id' and a non-empty 'text'")
        query_id = str(query_id)
        if query_id in seen:
            raise MedfaqError(f"{path}:{line_no}: duplicate query id {query_id!r} (first on line {seen[query_id]})")
        seen[query_id] = line_no
        rows.append({"_id": query_id, "text": text, "metadata": row.get("metadata") or {}})
    if not rows:
        raise MedfaqError(f"{path}: no queries")
    return rows


# ---- construction -------------------------------------------------------------------------------------------------


def make_benchmark(name: str, data_root: Path | None = None, bank: list[FaqRecord] | None = None) -> Benchmark:
    """Build benchmark `name` (one of `BENCHMARKS`) from fetched datasets, or from `data_root` (shared/data layout);
    ``medquad-chq`` needs the `bank` records (those of the MedQuAD index)."""
    if name not in BENCHMARKS:
        raise MedfaqError(f"unknown benchmark {name!r}; choose one of {', '.join(BENCHMARKS)}")
    if name == "quebec":
        return _quebec(data_root)
    if name == "covid-q":
        return _covid_q(data_root)
    if name == "medquad-rqe":
        return _medquad_rqe(data_root)
    if name == "medquad-chq":
        if not bank:
            raise MedfaqError("medquad-chq needs the MedQuAD index (build it with `medfaq index build medquad`)")
        return with_distractors(name, [make_benchmark(part, data_root) for part in CHQ_PARTS], bank)
    from medfaq.eval.summarization_data import load_pairs

    dataset, spec = BENCHMARKS[name]
    corpus_pairs = [pair for s in spec.corpus_splits for pair in load_pairs(f"{dataset}:{s}", data_root)]
    query_pairs = load_pairs(f"{dataset}:{spec.query_split}", data_root)
    return _pair_benchmark(name, query_pairs, corpus_pairs, spec.description)


def _normalise(text: str) -> str:
    return " ".join(text.lower().split())


def question_key(text: str) -> str:
    """A question's text as compared across datasets: lower-case, spaces collapsed, trailing punctuation stripped."""
    return _normalise(text).rstrip(string.punctuation + " ")


def dev_or_test(text: str) -> str:
    """The half of a real bank's questions a question falls in, by a seeded hash of its text (`DEV_SEED`)."""
    from medfaq.retriever.training.pair_data import is_heldout

    return "dev" if is_heldout(text, seed=DEV_SEED, fraction=0.5) else "test"


def benchmark_kind(name: str) -> str:
    """The declared kind of benchmark `name` (index/datasets.py); "" for a benchmark the registry does not know."""
    return BENCHMARKS[name][1].kind if name in BENCHMARKS else ""


def by_kind(names: Iterable[str]) -> list[tuple[str, list[str]]]:
    """`names` grouped by their kind in report order, real FAQ banks first (`BENCHMARK_KINDS`), undeclared ones
    ("") last; each group keeps the given order."""
    names = list(names)
    order = [*BENCHMARK_KINDS, ""]
    return [(kind, members) for kind in order if (members := [name for name in names if benchmark_kind(name) == kind])]


def kind_heading(kind: str) -> str:
    """The heading results of `kind` are reported under."""
    return BENCHMARK_KINDS.get(kind, "Benchmarks of no declared kind")


def _pair_benchmark(name: str, query_pairs: list[Any], corpus_pairs: list[Any], description: str) -> Benchmark:
    """Corpus = distinct FAQ strings of `corpus_pairs`; one query per distinct CHQ of `query_pairs`, judged
    relevant to the FAQs it is paired with."""
    corpus: dict[str, dict[str, Any]] = {}
    for pair in corpus_pairs:
        key = _normalise(pair.faq)
        if key not in corpus:
            corpus[key] = {"_id": f"faq-{len(corpus)}", "title": "", "text": pair.faq.strip(), "metadata": {}}
    queries: dict[str, dict[str, Any]] = {}
    qrels: Qrels = {}
    for pair in query_pairs:
        key = _normalise(pair.chq)
        if key not in queries:
            metadata = {"split": "test", "ood": False, "pair_id": pair.id}
            queries[key] = {"_id": f"q-{len(queries)}", "text": pair.chq.strip(), "metadata": metadata}
        query = queries[key]
        faq = corpus.get(_normalise(pair.faq))
        if faq is None:
            raise MedfaqError(f"{name}: the FAQ of pair {pair.id} is not in the corpus")
        qrels.setdefault(query["_id"], {})[faq["_id"]] = 1
    return Benchmark(name, list(corpus.values()), list(queries.values()), qrels, description)


def with_distractors(name: str, parts: list[Benchmark], bank: list[FaqRecord]) -> Benchmark:
    """The judged queries of `parts` searched against `bank` plus their gold FAQs: corpus = the bank's records
    (ids kept) and the gold FAQs not already in it (``<part>:<id>``); query ids become ``<part>:<id>``."""
    corpus = bank_corpus(bank)
    in_bank = ids_by_text(bank, _normalise)
    added: dict[str, str] = {}
    queries: list[dict[str, Any]] = []
    qrels: Qrels = {}
    for part in parts:
        texts = {row["_id"]: row["text"] for row in part.corpus}
        for query in part.queries:
            gold = part.qrels.get(query["_id"])
            if not gold:
                continue
            query_id = f"{part.name}:{query['_id']}"
            metadata = {**query.get("metadata", {}), "part": part.name, "words": len(query["text"].split())}
            queries.append({"_id": query_id, "text": query["text"], "metadata": metadata})
            for doc_id, relevance in gold.items():
                key = _normalise(texts[doc_id])
                if key not in in_bank and key not in added:
                    added[key] = f"{part.name}:{doc_id}"
                    corpus.append(
                        {"_id": added[key], "title": "", "text": texts[doc_id], "metadata": {"part": part.name}}
                    )
                for target in in_bank.get(key, [added.get(key)]):
                    qrels.setdefault(query_id, {})[target] = relevance
    description = (
        f"test CHQs of {', '.join(p.name for p in parts)} -> {len(bank)} bank FAQs + {len(added)} gold FAQs added; "
        "gold = the part's own judgements"
    )
    return Benchmark(name, corpus, queries, qrels, description, {"bank_size": len(bank), "added_gold": len(added)})


def bank_corpus(bank: list[FaqRecord]) -> list[dict[str, Any]]:
    """A bank's records as corpus rows, their ids kept."""
    return [{"_id": r.id, "title": "", "text": r.question, "metadata": {"source": r.source}} for r in bank]


def ids_by_text(bank: list[FaqRecord], key: Callable[[str], str]) -> dict[str, list[str]]:
    """The ids of the bank's records by the `key` of their question."""
    found: dict[str, list[str]] = {}
    for record in bank:
        found.setdefault(key(record.question), []).append(record.id)
    return found


def _medquad_rqe(data_root: Path | None) -> Benchmark:
    """The CHQs of `MEDQUAD_RQE_SPLITS` whose entailed FAQ (label 1) is a MedQuAD question by :func:`question_key`,
    against every MedQuAD record as it is; a CHQ is judged relevant to every record with an entailed FAQ's question."""
    from medfaq.index.pair_sources import dataset_file, load_jsonl_rows

    bank, _ = load_collection(dataset_file("medquad", "medquad.jsonl", data_root), format="medquad")
    in_bank = ids_by_text(bank, question_key)
    queries: dict[str, dict[str, Any]] = {}
    qrels: Qrels = {}
    for split in MEDQUAD_RQE_SPLITS:
        for row in load_jsonl_rows("rqe", f"{split}.jsonl", data_root):
            targets = in_bank.get(question_key(row["faq"]), []) if int(row["label"]) == 1 else []
            if not targets:
                continue
            text = row["chq"].strip()
            metadata = {"split": dev_or_test(text), "ood": False, "rqe_split": split, "words": len(text.split())}
            query = {"_id": f"q-{split}-{row['pid']}", "text": text, "metadata": metadata}
            query = queries.setdefault(question_key(text), query)
            qrels.setdefault(query["_id"], {}).update(dict.fromkeys(targets, 1))
    description = (
        f"RQE {'+'.join(MEDQUAD_RQE_SPLITS)} CHQs whose entailed FAQ is a MedQuAD question -> all {len(bank)} MedQuAD "
        f"records, nothing added; gold = every record with that question; halved into dev/test (seed {DEV_SEED})"
    )
    info = {"bank_size": len(bank)}
    return Benchmark("medquad-rqe", bank_corpus(bank), list(queries.values()), qrels, description, info)


def index_over_bank(benchmark: Benchmark, out: Path, bank_index: Path, additions: bool = True) -> int:
    """Index a corpus made of a bank and a few additions into `out`: copy the bank's index (`bank_index`) and
    encode only the corpus entries it lacks (without `additions`, a corpus entry it lacks is an error). Returns how
    many were encoded."""
    from medfaq.index.faq_index import FaqIndex

    index = FaqIndex.load(bank_index)
    rows = [row for row in benchmark.corpus if row["_id"] not in index]
    if rows and not additions:
        raise MedfaqError(
            f"the index {bank_index} lacks {len(rows)} of {benchmark.name}'s {len(benchmark.corpus)} FAQs (e.g. "
            f"{rows[0]['_id']!r}): give --bank an index of the same collection (`medfaq index build medquad`)"
        )
    index.editor().add([FaqRecord(row["_id"], row["text"], metadata=row["metadata"]) for row in rows])
    index.save(out)
    return len(rows)


def _quebec(data_root: Path | None) -> Benchmark:
    from medfaq.index.pair_sources import dataset_file
    from medfaq.retriever.training.pair_data import quebec_query_split

    records, _ = load_collection(dataset_file("quebec", "faqs.jsonl", data_root), format="quebec")
    corpus = [
        {"_id": r.id, "title": "", "text": r.question, "answer": r.answer, "metadata": {"url": r.url}} for r in records
    ]
    known = {r.id for r in records}
    _, heldout = quebec_query_split(seed=0, data_root=data_root)
    queries: list[dict[str, Any]] = []
    qrels: Qrels = {}
    seen: set[str] = set()
    for row in heldout:
        key = _normalise(row["question"])
        if key in seen:  # repeated query strings are one query
            continue
        seen.add(key)
        query_id = f"q-{row['id']}"
        ood = bool(row["is_ood"]) or str(row["passage_id"]) not in known
        split = dev_or_test(row["question"])
        queries.append({"_id": query_id, "text": row["question"].strip(), "metadata": {"split": split, "ood": ood}})
        if not ood:
            qrels[query_id] = {str(row["passage_id"]): 1}
    description = (
        "Quebec COVID FAQ (313): held-out train queries (retriever.training.pair_data.quebec_query_split, seed 0), "
        f"halved into dev/test by a second hash (seed {DEV_SEED}); HealthTap questions are out of scope "
        "(no qrels)"
    )
    return Benchmark("quebec", corpus, queries, qrels, description)


def covid_q_classes(data_root: Path | None = None) -> dict[str, list[str]]:
    """COVID-Q's questions by class (``Question ID``), in file order, repeated strings once."""
    return _covid_q_rows(data_root)[0]


def covid_q_answers(data_root: Path | None = None) -> dict[str, str]:
    """Each COVID-Q class's answer: the first non-blank one of its rows."""
    return _covid_q_rows(data_root)[1]


def _covid_q_rows(data_root: Path | None) -> tuple[dict[str, list[str]], dict[str, str]]:
    import csv

    from medfaq.index.pair_sources import dataset_file

    path = dataset_file("covid_q", "final_master_dataset.csv", data_root)
    classes: dict[str, list[str]] = {}
    answers: dict[str, str] = {}
    with path.open(encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            text = " ".join(row["Question"].split())
            if text and text not in classes.setdefault(row["Question ID"], []):
                classes[row["Question ID"]].append(text)
            answer = " ".join((row.get("Answers") or "").split())
            if answer and not answers.get(row["Question ID"]):
                answers[row["Question ID"]] = answer
    if not classes:
        raise MedfaqError(f"{path} holds no questions")
    return classes, answers


def covid_q_faq_id(class_id: str) -> str:
    return f"covidq-{class_id}"


def _covid_q(data_root: Path | None) -> Benchmark:
    """A bank no model here trained on: the first question of each COVID-Q class is its FAQ (two classes whose first
    questions differ only in case share one), every other question of the class a query judged relevant to it (a
    text that is some FAQ's is not a query), halved into dev and test (`dev_or_test`)."""
    classes, answers = _covid_q_rows(data_root)
    faq_of: dict[str, str] = {}  # normalised FAQ text -> the id of the first class that has it
    corpus = []
    for class_id, texts in classes.items():
        key = _normalise(texts[0])
        if key not in faq_of:
            faq_of[key] = covid_q_faq_id(class_id)
            row = {"_id": faq_of[key], "title": "", "text": texts[0], "answer": answers.get(class_id, "")}
            corpus.append({**row, "metadata": {}})
    queries: dict[str, dict[str, Any]] = {}
    qrels: Qrels = {}
    for texts in classes.values():
        for text in texts[1:]:
            if _normalise(text) in faq_of:
                continue
            query = queries.setdefault(
                text, {"_id": f"q-{len(queries)}", "text": text, "metadata": {"split": dev_or_test(text), "ood": False}}
            )
            qrels.setdefault(query["_id"], {})[faq_of[_normalise(texts[0])]] = 1
    description = (
        "COVID-Q: each class's first question is its FAQ; its other questions are the queries, halved into dev/test "
        f"(seed {DEV_SEED})"
    )
    return Benchmark("covid-q", corpus, list(queries.values()), qrels, description)


QUERY_PARTS = ("train", "dev", "test")


def split_queries(benchmark: Benchmark, seed: int = 0, fractions: tuple[float, ...] = (0.6, 0.2, 0.2)) -> dict:
    """The judged queries of `benchmark` in seeded train / dev / test parts (`fractions`), by a hash of each query's
    normalised text (a repeated question stays in one part): {part: (queries, qrels)}. The train part's (question,
    gold FAQ question) pairs can train a stage for this bank, the dev part choose its settings, and the test part
    is scored once."""
    from medfaq.retriever.training.pair_data import hashed_position

    if len(fractions) != len(QUERY_PARTS) or min(fractions) <= 0 or abs(sum(fractions) - 1) > 1e-6:
        raise MedfaqError(f"give three positive fractions for {'/'.join(QUERY_PARTS)} that sum to 1, got {fractions}")
    bounds = [sum(fractions[: i + 1]) for i in range(len(fractions))]
    parts: dict[str, tuple[list[dict[str, Any]], Qrels]] = {part: ([], {}) for part in QUERY_PARTS}
    for query in benchmark.queries:
        if query["_id"] not in benchmark.qrels:
            continue
        position = hashed_position(query["text"], seed)
        part = QUERY_PARTS[next(i for i, bound in enumerate(bounds) if position < bound or i == len(bounds) - 1)]
        parts[part][0].append({**query, "metadata": {**query.get("metadata", {}), "part": part, "part_seed": seed}})
        parts[part][1][query["_id"]] = benchmark.qrels[query["_id"]]
    return parts


def save_query_parts(benchmark: Benchmark, out: Path, seed: int, fractions: tuple[float, ...]) -> dict[str, int]:
    """Write :func:`split_queries`' parts into ``out/<part>/``: ``queries.jsonl``, ``qrels.tsv``, ``qrels.trec``
    and ``pairs.jsonl`` (``{"chq", "faq"}``: each question with its first gold FAQ's question, training pairs for
    `medfaq train summarizer --train-data`). Returns the queries per part."""
    texts = {row["_id"]: row["text"] for row in benchmark.corpus}
    counts = {}
    for part, (queries, qrels) in split_queries(benchmark, seed, fractions).items():
        directory = out / part
        directory.mkdir(parents=True, exist_ok=True)
        _write_jsonl(directory / "queries.jsonl", queries)
        write_qrels(directory / "qrels.tsv", qrels)
        write_qrels(directory / "qrels.trec", qrels, trec=True)
        pairs = [{"id": q["_id"], "chq": q["text"], "faq": texts[next(iter(qrels[q["_id"]]))]} for q in queries]
        _write_jsonl(directory / "pairs.jsonl", pairs)
        counts[part] = len(queries)
    return counts


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
