"""Relevance judgments and ranking metrics, below both `eval` (benchmarks, `medfaq eval retrieval`) and `retriever`
(the per-index decisions): qrels and TREC run files, a run's metrics with pytrec_eval, and the first-hit metrics
(R@1, MRR@10) of ranked FAQ ids the decisions compare pipelines by."""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from medfaq.common.runtime import MedfaqError

Qrels = dict[str, dict[str, int]]
Run = dict[str, dict[str, float]]
CUTOFF = 10  # MRR@10, nDCG@10
METRICS = {
    "recall@1": "recall_1",
    "recall@5": "recall_5",
    "recall@10": "recall_10",
    "mrr@10": "recip_rank",
    "ndcg@10": "ndcg_cut_10",
    "p@5": "P_5",
}


def write_qrels(path: str | Path, qrels: Qrels, trec: bool = False) -> None:
    """BEIR ``qrels.tsv`` (header ``query-id corpus-id score``, tab-separated) or TREC qrels (``qid 0 docid rel``)."""
    lines = [] if trec else ["query-id\tcorpus-id\tscore"]
    for query_id in sorted(qrels):
        for doc_id, rel in sorted(qrels[query_id].items()):
            lines.append(f"{query_id} 0 {doc_id} {rel}" if trec else f"{query_id}\t{doc_id}\t{rel}")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_qrels(path: str | Path) -> Qrels:
    """Relevance judgements from BEIR ``qrels.tsv`` (3 columns, optional header) or TREC qrels (4 columns)."""
    path = Path(path)
    if not path.is_file():
        raise MedfaqError(f"qrels file not found: {path}")
    qrels: Qrels = {}
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split()
        if not parts or (line_no == 1 and parts[0] == "query-id"):
            continue
        if len(parts) not in (3, 4) or not parts[-1].lstrip("-").isdigit():
            raise MedfaqError(f"{path}:{line_no}: expected 'query-id corpus-id score' or 'qid 0 docid relevance'")
        query_id, doc_id = parts[0], parts[-2]
        qrels.setdefault(query_id, {})[doc_id] = int(parts[-1])
    if not qrels:
        raise MedfaqError(f"{path}: no relevance judgements")
    return qrels


def read_trec_run(path: str | Path) -> Run:
    """A TREC run file (``qid Q0 docid rank score tag``) as ``{qid: {docid: score}}``."""
    path = Path(path)
    if not path.is_file():
        raise MedfaqError(f"run file not found: {path}")
    run: Run = {}
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 6:
            raise MedfaqError(f"{path}:{line_no}: expected 'qid Q0 docid rank score tag'")
        try:
            run.setdefault(parts[0], {})[parts[2]] = float(parts[4])
        except ValueError:
            raise MedfaqError(f"{path}:{line_no}: score {parts[4]!r} is not a number") from None
    return run


def truncate_run(run: Run, depth: int = CUTOFF) -> Run:
    """The best `depth` documents of each query (score descending, then id), so MRR is MRR@`depth`."""
    return {q: dict(sorted(docs.items(), key=lambda item: (-item[1], item[0]))[:depth]) for q, docs in run.items()}


def ranking_metrics(run: Run, qrels: Qrels) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Mean metrics in percent over all judged queries (a query missing from `run` scores 0), and per query."""
    if not qrels:
        return {name: math.nan for name in METRICS}, {}
    run = truncate_run({q: run.get(q, {}) for q in qrels})
    import pytrec_eval  # imported late: reading judgments needs no evaluator

    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"recall.1,5,10", "recip_rank", "ndcg_cut.10", "P.5"})
    scores = evaluator.evaluate(run)
    per_query = {q: {name: values[key] for name, key in METRICS.items()} for q, values in scores.items()}
    means = {name: 100.0 * statistics.fmean(values[name] for values in per_query.values()) for name in METRICS}
    return means, per_query


def first_hits(
    ranked: Mapping[str, Sequence[str]], golds: Mapping[str, Collection[str]], cutoff: int = CUTOFF
) -> tuple[float, float, set[str]]:
    """R@1 and MRR@`cutoff` (in %) of each question's ranked FAQ ids (by question id) against its relevant ones: the
    share of questions whose first FAQ is relevant, the mean reciprocal rank of the first relevant one; and the ids of
    the questions answered at rank 1."""
    firsts = {qid for qid, ids in ranked.items() if ids[:1] and ids[0] in golds[qid]}
    reciprocal = (
        next((1 / rank for rank, faq_id in enumerate(ids[:cutoff], 1) if faq_id in golds[qid]), 0.0)
        for qid, ids in ranked.items()
    )
    count = max(len(ranked), 1)
    return 100 * len(firsts) / count, 100 * sum(reciprocal) / count, firsts
