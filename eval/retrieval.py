"""Retrieval evaluation: ranking metrics with pytrec_eval, abstention on out-of-scope queries, and the side-by-side
comparison of pipeline variants (BM25 / dense / hybrid / + rerank / + summarizer / raw+summary fusion).

Ranking metrics are computed on the judged ``test`` queries: Recall@1/5/10, MRR@10, nDCG@10 and P@5 (in percent).
With out-of-scope queries, the pipeline's confidence (:func:`retriever.pipeline.confidence`) is the score of an
"in scope?" classifier: AUROC on the test queries, and accuracy at the threshold that maximises accuracy on the
``dev`` queries (answer in-scope questions, abstain on out-of-scope ones). Beside that abstention accuracy,
selective accuracy counts a test query right only when it is answered with a gold FAQ on top (or, out of scope,
abstained on), and `precision` is the share of answered test queries whose top hit is a gold FAQ.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from medfaq.common.ranking import CUTOFF, METRICS, Qrels, Run, ranking_metrics, truncate_run
from medfaq.common.runtime import MedfaqError
from medfaq.index.faq_index import FaqIndex
from medfaq.retriever.decisions.abstention import as_scores, at_threshold, calibrate_threshold
from medfaq.retriever.pipeline import (
    RERANK_MARGIN,
    LikelihoodScorer,
    Pipeline,
    PipelineConfig,
    QueryRewriter,
    Reranker,
    SearchResponse,
    corrects_first_stage,
)
from medfaq.retriever.stages import STAGES

ABSTAIN_METRICS = ("auroc", "threshold", "accuracy", "selective_acc", "precision", "answered", "ood_abstained")
BATCH = 32


def exact_search_run(
    query_ids: list[str], query_vectors: np.ndarray, doc_ids: list[str], doc_vectors: np.ndarray, depth: int = CUTOFF
) -> Run:
    """The run of exact cosine (inner-product) search of unit `query_vectors` over `doc_vectors`: each query's best
    `depth` documents with their scores."""
    scores = query_vectors @ doc_vectors.T
    top = np.argsort(-scores, axis=1)[:, :depth]
    return {query: {doc_ids[j]: float(scores[i, j]) for j in top[i]} for i, query in enumerate(query_ids)}


def abstention_metrics(
    test_in_scope: list[bool],
    test_confidences: list[float | None],
    dev_in_scope: list[bool],
    dev_confidences: list[float | None],
    test_correct: list[bool] | None = None,
) -> dict[str, float]:
    """AUROC of confidence as an in-scope score and accuracy at the dev-calibrated threshold (test), in percent;
    `answered` = in-scope test queries answered, `ood_abstained` = out-of-scope test queries abstained on. With
    `test_correct` (the top hit is a gold FAQ): `selective_acc` = test queries answered correctly or rightly
    abstained on, `precision` = answered test queries whose top hit is gold."""
    labels = np.array(test_in_scope, dtype=bool)
    threshold = calibrate_threshold(dev_in_scope, dev_confidences) if dev_in_scope else 0.0
    answered = as_scores(test_confidences) >= threshold
    metrics = at_threshold(test_in_scope, test_confidences, threshold)
    if test_correct is not None:
        correct = np.array(test_correct, dtype=bool) & labels
        metrics["selective_acc"] = 100.0 * float(np.mean(np.where(answered, correct, ~labels)))
        metrics["precision"] = 100.0 * float(correct[answered].mean()) if answered.any() else math.nan
    return metrics


@dataclass
class RetrievalEvaluator:
    """Evaluate a run (and the per-query confidences) against `qrels`.

    `ood_ids` are out-of-scope queries (no qrels); `dev_ids` are held out for threshold calibration: ranking
    metrics and abstention results are computed on the remaining (test) queries.
    """

    qrels: Qrels
    ood_ids: set[str]
    dev_ids: set[str]
    name: str = ""
    listed: RetrievalEvaluator | None = None  # also scores the run on some of the questions (their metrics: "listed")

    def test_qrels(self) -> Qrels:
        return {q: docs for q, docs in self.qrels.items() if q not in self.dev_ids and q not in self.ood_ids}

    def restricted(self, ids: set[str]) -> RetrievalEvaluator:
        """The same evaluation on the questions in `ids` only (dev calibration included)."""
        qrels = {q: docs for q, docs in self.qrels.items() if q in ids}
        return RetrievalEvaluator(qrels, self.ood_ids & ids, self.dev_ids & ids, self.name)

    def __call__(self, run: Run, confidences: dict[str, float | None] | None = None) -> dict[str, Any]:
        metrics: dict[str, Any]
        metrics, _ = ranking_metrics(run, self.test_qrels())
        if self.ood_ids and confidences is not None:
            scoped = [q for q in confidences if q in self.qrels or q in self.ood_ids]

            def part(dev: bool) -> list[str]:
                return [q for q in scoped if (q in self.dev_ids) == dev]

            def labelled(ids: list[str]) -> tuple[list[bool], list[float | None]]:
                return [q not in self.ood_ids for q in ids], [confidences[q] for q in ids]

            test = part(False)
            top = truncate_run({q: run.get(q, {}) for q in test}, 1)
            correct = [any(doc in self.qrels.get(q, {}) for doc in top[q]) for q in test]
            metrics.update(abstention_metrics(*labelled(test), *labelled(part(True)), correct))
        if self.listed is not None:
            metrics["listed"] = self.listed(run, confidences)
        return metrics


def format_table(rows: list[tuple[str, dict[str, float]]]) -> str:
    """Metrics side by side, one row per system; abstention columns appear when any row has them."""
    columns = list(METRICS) + [m for m in ABSTAIN_METRICS if any(m in values for _, values in rows)]
    width = max([len("system")] + [len(name) for name, _ in rows])
    lines = [f"{'system':<{width}}  " + "  ".join(f"{c:>13}" for c in columns)]
    for name, values in rows:
        cells = [f"{values[c]:>13.3f}" if c == "threshold" else f"{values.get(c, math.nan):>13.1f}" for c in columns]
        lines.append(f"{name:<{width}}  " + "  ".join(cells))
    return "\n".join(lines)


def run_pipeline(
    pipeline: Pipeline, queries: dict[str, str], progress: bool = True, desc: str = "queries"
) -> tuple[Run, dict[str, float | None], list[SearchResponse]]:
    """Search every query in batches: the run ``{qid: {faq id: score}}`` (scores follow the final ranking), the
    per-query confidence, and the responses in query order."""
    ids = list(queries)
    responses: list[SearchResponse] = []
    for start in tqdm(range(0, len(ids), BATCH), desc=desc, unit="batch", disable=not progress):
        responses += pipeline.run_batch([queries[q] for q in ids[start : start + BATCH]])
    run = {q: {h.id: float(len(r.hits) - h.rank + 1) for h in r.hits} for q, r in zip(ids, responses, strict=True)}
    return run, {q: r.confidence for q, r in zip(ids, responses, strict=True)}, responses


class CachedRewriter:
    """Memoises a rewriter, so the comparison summarizes each question once; `known` summaries are not recomputed."""

    def __init__(self, rewriter: QueryRewriter, known: dict[str, str] | None = None) -> None:
        self.rewriter = rewriter
        self.cache: dict[str, str] = dict(known or {})

    def rewrite(self, texts: list[str]) -> list[str]:
        missing = list(dict.fromkeys(t for t in texts if t not in self.cache))
        if missing:
            self.cache.update(zip(missing, self.rewriter.rewrite(missing), strict=True))
        return [self.cache[t] for t in texts]


class CachedReranker:
    """Memoises (query, candidate) scores (and the scoring options, e.g. a likelihood's prior weight), so variants
    sharing candidates score each pair once."""

    def __init__(self, reranker: Reranker | LikelihoodScorer) -> None:
        self.reranker = reranker
        self.corrects_first_stage = corrects_first_stage(reranker)
        self.cache: dict[tuple[Any, ...], float] = {}

    def score(self, query: str, candidates: list[str], *options: Any) -> list[float]:
        missing = list(dict.fromkeys(c for c in candidates if (query, c, *options) not in self.cache))
        if missing:
            scores = self.reranker.score(query, missing, *options)
            self.cache.update(((query, c, *options), float(s)) for c, s in zip(missing, scores, strict=True))
        return [self.cache[(query, c, *options)] for c in candidates]


# summary-* search with the summary; fusion = raw + summary by RRF (dense-fusion: of two dense lists);
# hybrid-wN: the dense list weighs N in hybrid RRF; rerank-rrf-w1: retrieval and cross-encoder ranks weigh the same,
# k = 60; rerank-rrf-k60: the retrieval rank weighs 1.5, k = 60 (the reranking RRF before the default's w = 3, k = 10);
# rerank-rrf-gated: only questions whose top two cosines differ by less than RERANK_MARGIN are reranked;
# likelihood: the summarizer's likelihood of each top hit joins the reranking RRF (-gated: behind the same gate)
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("bm25", {"mode": "bm25"}),
    ("dense", {"mode": "dense"}),
    ("hybrid", {"mode": "hybrid"}),
    ("hybrid-w2", {"mode": "hybrid", "dense_weight": 2.0}),
    ("hybrid-w3", {"mode": "hybrid", "dense_weight": 3.0}),
    ("hybrid+rerank", {"mode": "hybrid", "rerank": True}),
    ("hybrid+rerank-rrf", {"mode": "hybrid", "rerank": True, "rerank_fusion": "rrf"}),
    ("hybrid-w2+rerank-rrf", {"mode": "hybrid", "dense_weight": 2.0, "rerank": True, "rerank_fusion": "rrf"}),
    ("dense+rerank", {"mode": "dense", "rerank": True}),
    ("dense+rerank-rrf", {"mode": "dense", "rerank": True, "rerank_fusion": "rrf"}),
    (
        "dense+rerank-rrf-w1",
        {"mode": "dense", "rerank": True, "rerank_fusion": "rrf", "rerank_retrieval_weight": 1.0, "rerank_rrf_k": 60},
    ),
    (
        "dense+rerank-rrf-k60",
        {"mode": "dense", "rerank": True, "rerank_fusion": "rrf", "rerank_retrieval_weight": 1.5, "rerank_rrf_k": 60},
    ),
    (
        "dense+rerank-rrf-gated",
        {"mode": "dense", "rerank": True, "rerank_fusion": "rrf", "rerank_margin": RERANK_MARGIN},
    ),
    ("dense+likelihood", {"mode": "dense", "likelihood": True}),
    ("dense+likelihood-gated", {"mode": "dense", "likelihood": True, "rerank_margin": RERANK_MARGIN}),
    ("dense+rerank-rrf+likelihood", {"mode": "dense", "rerank": True, "rerank_fusion": "rrf", "likelihood": True}),
    (
        "dense+rerank-rrf+likelihood-gated",
        {"mode": "dense", "rerank": True, "rerank_fusion": "rrf", "likelihood": True, "rerank_margin": RERANK_MARGIN},
    ),
    ("summary-bm25", {"mode": "bm25", "summarize": True, "query_source": "summary"}),
    ("summary-dense", {"mode": "dense", "summarize": True, "query_source": "summary"}),
    ("summary-hybrid", {"mode": "hybrid", "summarize": True, "query_source": "summary"}),
    ("summary-hybrid+rerank", {"mode": "hybrid", "summarize": True, "query_source": "summary", "rerank": True}),
    ("fusion", {"mode": "hybrid", "summarize": True, "query_source": "both"}),
    ("fusion+rerank", {"mode": "hybrid", "summarize": True, "query_source": "both", "rerank": True}),
    ("dense-fusion", {"mode": "dense", "summarize": True, "query_source": "both"}),
    (
        "dense-fusion+rerank-rrf",
        {"mode": "dense", "summarize": True, "query_source": "both", "rerank": True, "rerank_fusion": "rrf"},
    ),
]


STAGE_SWITCHES = {stage.switch: stage.name for stage in STAGES if stage.model}  # switch setting -> stage with a model


def stages_needed(systems: list[str] | None) -> tuple[str, ...]:
    """The stage kinds the variants named in `systems` (None: all) run."""
    chosen = [changes for name, changes in VARIANTS if systems is None or name in systems]
    return tuple(kind for switch, kind in STAGE_SWITCHES.items() if any(c.get(switch) for c in chosen))


def compare_variants(
    index: FaqIndex,
    queries: dict[str, str],
    evaluator: RetrievalEvaluator,
    base: PipelineConfig,
    rewriter: QueryRewriter | None = None,
    reranker: Reranker | None = None,
    progress: bool = True,
    on_row: Callable[[str, dict[str, float]], None] | None = None,
    systems: list[str] | None = None,
    summaries: dict[str, str] | None = None,
    likelihood: LikelihoodScorer | None = None,
) -> tuple[list[tuple[str, dict[str, float]]], list[str]]:
    """Evaluate the variants of `VARIANTS` (all, or those named in `systems`) on top of `base` (its depths, k,
    thresholds); variants needing a stage that is None are skipped and named in the second list. Summaries and
    rerank scores are computed once; `summaries` (question -> summary) are used as given."""
    unknown = sorted(set(systems or []) - {name for name, _ in VARIANTS})
    if unknown:
        raise MedfaqError(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(n for n, _ in VARIANTS)}")
    rewriter = CachedRewriter(rewriter, summaries) if rewriter is not None else None
    reranker = CachedReranker(reranker) if reranker is not None else None
    likelihood = CachedReranker(likelihood) if likelihood is not None else None
    rows: list[tuple[str, dict[str, float]]] = []
    skipped: list[str] = []
    for name, changes in VARIANTS:
        if systems and name not in systems:
            continue
        settings = {
            "summarize": False,
            "query_source": "raw",
            "rerank": False,
            "likelihood": False,
            "rerank_fusion": "replace",
            "dense_weight": 1.0,
            **changes,
        }
        needed = {"summarize": rewriter, "rerank": reranker, "likelihood": likelihood}
        if any(settings[switch] and stage is None for switch, stage in needed.items()):
            skipped.append(name)
            continue
        config = base.updated(**settings, abstain=False, log_unanswered=False)
        pipeline = Pipeline(index, config, rewriter=rewriter, reranker=reranker, likelihood=likelihood)
        run, confidences, _ = run_pipeline(pipeline, queries, progress, desc=name)
        rows.append((name, evaluator(run, confidences)))
        if on_row is not None:
            on_row(*rows[-1])
    return rows, skipped
