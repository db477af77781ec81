"""Abstention thresholds that travel with a model, so a new index abstains before anyone labels a query.

The rule (written before any result was looked at):

* Development split of the query -> FAQ task: the validation consumer questions of MeQSum, HealthCareMagic and
  CHQ-Summ (`CALIBRATION_SOURCES`; training reads their ``train.jsonl`` only, and no benchmark tests on them), at most
  `MAX_QUERIES` of each (a seeded sample).
* Bank, per source: the distinct FAQ questions of its train and valid splits, indexed with the model as `medfaq index
  build` indexes by default (``--synonyms auto``).
* In scope: each question searched against the whole bank (it must be answered). Out of scope: the same question
  searched against the bank without the gold FAQ of any development question, nor an FAQ with the same normalised
  text as one or within cosine `NEAR_DUPLICATE` of one (the false-negative rule of hard-negative mining): its answer
  is no longer there, so it must be abstained on.
* Confidence: the default pipeline's (:func:`retriever.pipeline.confidence`): for a bi-encoder, dense search over the
  raw question (key ``dense@raw``, the top cosine); for a reranker, dense search with the encoder it corrects (its
  prior, else the encoder that mined its negatives) reranked by it (key ``dense+rerank@raw``).
* Threshold: :func:`calibrate_threshold` over both sets, the rule ``medfaq eval retrieval --save-threshold`` applies
  to a benchmark's development queries (the accuracy-maximising midpoint between two observed confidences).

The result is ``threshold.json`` in the model directory (:class:`~retriever.threshold_files.ModelThreshold`); an
index built with the model starts with it in ``pipeline.json``, marked as inherited (:func:`inherit_thresholds`). The
stock encoders (`STOCK_ENCODERS`) are calibrated by the same rule once and ship their thresholds in
``stock_thresholds.json``, matched to an index by its encoder's weights fingerprint (``python
experiments/stock_thresholds.py`` re-creates the file). What a model carries, and what an index inherits of it, is
:mod:`retriever.threshold_files`'.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from medfaq.common.runtime import MedfaqError, minilm_path, resolve_model
from medfaq.index.datasets import CALIBRATION_SOURCES
from medfaq.retriever.threshold_files import THRESHOLD_FILE as THRESHOLD_FILE  # where `train calibrate` saves it
from medfaq.retriever.threshold_files import ModelThreshold, model_thresholds

logger = logging.getLogger("medfaq.abstention")

MAX_QUERIES = 200  # development questions per source (a seeded sample)
NEAR_DUPLICATE = 0.9  # an FAQ this close to a removed gold FAQ is removed too (as in hard-negative mining)
NEAR_DEPTH = 20  # bank FAQs examined per removed gold FAQ for near-duplicates
SYNONYMS = "auto"  # the lexicon `medfaq index build` uses by default
STOCK_ENCODERS = ("minilm", "mpnet")  # shipped with medfaq: all-MiniLM-L6-v2, all-mpnet-base-v2
CONFIDENCES = {
    "dense@raw": "cosine of the top hit of dense search over the raw question",
    "dense+rerank@raw": "cross-encoder score of the top hit of dense search reranked",
}


def as_scores(confidences: list[float | None]) -> np.ndarray:
    """None (no hit at all) is the least confident value."""
    return np.array([-np.inf if c is None else float(c) for c in confidences], dtype=np.float64)


def calibrate_threshold(in_scope: list[bool], confidences: list[float | None]) -> float:
    """The threshold (answer when confidence >= it) with the best accuracy on these labelled queries; ties go to
    the lowest, and a threshold lies midway between two observed confidences."""
    labels = np.array(in_scope, dtype=bool)
    scores = as_scores(confidences)
    values = np.unique(scores[np.isfinite(scores)])
    if len(values) == 0:
        return 0.0
    candidates = np.concatenate([[values[0] - 1e-6], (values[:-1] + values[1:]) / 2, [values[-1] + 1e-6]])
    accuracy = [float(np.mean((scores >= t) == labels)) for t in candidates]
    return float(candidates[int(np.argmax(accuracy))])


def at_threshold(in_scope: list[bool], confidences: list[float | None], threshold: float) -> dict[str, float]:
    """Answering when the confidence is at least `threshold`, in percent: accuracy, in-scope queries answered,
    out-of-scope ones abstained on; and AUROC of the confidence as an in-scope score (NaN with one class only)."""
    from sklearn.metrics import roc_auc_score

    labels = np.array(in_scope, dtype=bool)
    scores = as_scores(confidences)
    floor = np.min(scores[np.isfinite(scores)], initial=0.0) - 1.0
    answered = scores >= threshold
    both = 0 < labels.sum() < len(labels)
    return {
        "auroc": 100.0 * float(roc_auc_score(labels, np.where(np.isfinite(scores), scores, floor)))
        if both
        else float("nan"),
        "threshold": threshold,
        "accuracy": 100.0 * float(np.mean(answered == labels)),
        "answered": 100.0 * float(answered[labels].mean()) if labels.any() else float("nan"),
        "ood_abstained": 100.0 * float((~answered[~labels]).mean()) if (~labels).any() else float("nan"),
    }


@dataclass
class CalibrationSource:
    """One source's development questions, their gold FAQs and the bank (FAQ questions) they are searched in."""

    name: str
    queries: list[str]
    golds: list[str]
    bank: list[str]


def calibration_sources(
    data_root: Path | None = None, seed: int = 0, max_queries: int = MAX_QUERIES
) -> list[CalibrationSource]:
    """The development split of `CALIBRATION_SOURCES` (those fetched; at least one is needed), at most `max_queries`
    questions of each."""
    from medfaq.index.pair_sources import load_jsonl_rows
    from medfaq.retriever.training.pair_data import normalise, subsample

    sources = []
    for name in CALIBRATION_SOURCES:
        try:
            train = load_jsonl_rows(name, "train.jsonl", data_root)
            valid = load_jsonl_rows(name, "valid.jsonl", data_root)
        except MedfaqError:
            logger.info("%s not fetched: left out of the calibration", name)
            continue
        bank = list({normalise(row["faq"]): row["faq"] for row in [*train, *valid]}.values())
        picked = subsample(valid, max_queries, seed)
        sources.append(CalibrationSource(name, [row["chq"] for row in picked], [row["faq"] for row in picked], bank))
    if not sources:
        wanted = " ".join(CALIBRATION_SOURCES)
        raise MedfaqError(f"calibrating a threshold needs a development split: run `medfaq data fetch {wanted}`")
    return sources


def without_answers(index: Any, golds: list[str]) -> int:
    """Delete from `index` every FAQ whose question is one of `golds` (normalised) or lies within cosine
    `NEAR_DUPLICATE` of one; returns how many were deleted."""
    from medfaq.retriever.training.pair_data import normalise

    wanted = {normalise(text) for text in golds}
    doomed = {record.id for record in index.records() if normalise(record.question) in wanted}
    for hits in index.search_dense(list(dict.fromkeys(golds)), min(NEAR_DEPTH, len(index))):
        doomed.update(faq_id for faq_id, score in hits if score >= NEAR_DUPLICATE)
    return index.editor().delete(sorted(doomed)) if doomed else 0


def _calibration_config(model_dir: Path) -> tuple[str, Any]:
    """(the encoder the bank is indexed with, the pipeline config whose confidence is calibrated) for a model."""
    from medfaq.retriever.pipeline import PipelineConfig
    from medfaq.retriever.reranker.base import calibration_first_stage
    from medfaq.retriever.training.config import EncoderTrainConfig
    from medfaq.retriever.training.pair_models import model_type_of

    quiet = {"entities": False, "abstain": False, "log_unanswered": False}
    if model_type_of(model_dir) == "biencoder":
        return str(model_dir), PipelineConfig(**quiet)
    first_stage = calibration_first_stage(EncoderTrainConfig.load(model_dir))
    return resolve_model(first_stage), PipelineConfig(rerank=True, reranker=str(model_dir), **quiet)


def measure_threshold(
    model: str | Path, data_root: Path | None = None, seed: int = 0, max_queries: int = MAX_QUERIES
) -> tuple[ModelThreshold, str]:
    """The abstention threshold of the bi-encoder or reranker `model` on the development split (the module
    docstring's rule), and the weights fingerprint of the encoder its bank was indexed with; nothing is saved."""
    from medfaq.index.concepts import concept_lexicon
    from medfaq.index.encoder import load_encoder
    from medfaq.index.faq_index import FaqIndex
    from medfaq.index.records import FaqRecord
    from medfaq.retriever.model_cache import build_pipeline

    model_dir = Path(resolve_model(str(model)))
    first_stage, config = _calibration_config(model_dir)
    concepts = concept_lexicon(SYNONYMS)
    encoder = load_encoder(first_stage)  # the backend `index build` uses by default
    labels: list[bool] = []
    confidences: list[float | None] = []
    described: dict[str, dict[str, int]] = {}
    for source in calibration_sources(data_root, seed, max_queries):
        records = [FaqRecord(id=str(i), question=text) for i, text in enumerate(source.bank)]
        index = FaqIndex.build(records, encoder, progress=False, concepts=concepts)
        pipeline = build_pipeline(index, config)
        answerable = [response.confidence for response in pipeline.run_batch(source.queries)]
        removed = without_answers(index, source.golds)
        unanswerable = [response.confidence for response in pipeline.run_batch(source.queries)]
        labels += [True] * len(answerable) + [False] * len(unanswerable)
        confidences += answerable + unanswerable
        described[source.name] = {"queries": len(source.queries), "bank": len(records), "removed": removed}
        logger.info("%s: %d questions, bank of %d, %d removed", source.name, len(source.queries), len(records), removed)
    development = at_threshold(labels, confidences, calibrate_threshold(labels, confidences))
    threshold = ModelThreshold(
        value=development.pop("threshold"),
        key=config.threshold_key,
        confidence=CONFIDENCES[config.threshold_key],
        first_stage=first_stage,
        synonyms=concepts.source if concepts else "none",
        calibrated_on={
            "split": "valid",
            "sources": described,
            "out_of_scope": f"the same questions with their gold FAQs (and FAQs within cosine {NEAR_DUPLICATE}) "
            "removed from the bank",
            "rule": "best accuracy on the development questions (eval.retrieval --save-threshold's rule)",
            "seed": seed,
        },
        counts={"in_scope": labels.count(True), "out_of_scope": labels.count(False)},
        development=development,
    )
    return threshold, encoder.fingerprint


def calibrate_model(model_dir: str | Path, data_root: Path | None = None, seed: int = 0) -> ModelThreshold:
    """Calibrate the abstention threshold of the bi-encoder or reranker in `model_dir` (:func:`measure_threshold`)
    and save it there as ``threshold.json``."""
    model_dir = Path(resolve_model(str(model_dir)))
    if model_dir == Path(minilm_path()).resolve():
        raise MedfaqError(
            "stock MiniLM's threshold ships with medfaq (python experiments/stock_thresholds.py re-creates it); "
            "to calibrate MiniLM as your own model, copy its directory and calibrate the copy"
        )
    threshold, _ = measure_threshold(model_dir, data_root, seed)
    threshold.save(model_dir)
    return threshold


def calibrate_stock(
    name: str, data_root: Path | None = None, seed: int = 0, max_queries: int = MAX_QUERIES
) -> tuple[ModelThreshold, str]:
    """The threshold of stock encoder `name` (one of `STOCK_ENCODERS`), its first stage recorded by name, and the
    fingerprint of its weights (:func:`measure_threshold`)."""
    if name not in STOCK_ENCODERS:
        raise MedfaqError(f"unknown stock encoder {name!r}; choose one of {', '.join(STOCK_ENCODERS)}")
    threshold, fingerprint = measure_threshold(name, data_root, seed, max_queries)
    return replace(threshold, first_stage=name), fingerprint


def inherit_thresholds(index_dir: str | Path, encoder: str, reranker: str | Path | None = None) -> dict[str, float]:
    """Write the thresholds an index encoded by `encoder` inherits (:func:`model_thresholds`, matched to the encoder
    fingerprint in its manifest) into its
    ``pipeline.json``, each marked as inherited with where it came from; inherited ones of an earlier encoder are
    dropped, thresholds calibrated on the index itself (``--save-threshold``) kept. Returns the thresholds written."""
    from medfaq.index.storage import is_index, read_manifest
    from medfaq.retriever.pipeline import PipelineConfig
    from medfaq.retriever.pipeline_file import update_config

    built = is_index(index_dir)
    found = model_thresholds(encoder, reranker, read_manifest(Path(index_dir)).encoder_fingerprint if built else "")

    def inherit(saved: PipelineConfig | None) -> PipelineConfig | None:
        config = saved or PipelineConfig()
        thresholds = {k: v for k, v in config.thresholds.items() if k not in config.inherited_thresholds}
        inherited = {key: origin for key, (_, origin) in found.items() if key not in thresholds}
        if not inherited and (saved is None or not saved.inherited_thresholds):
            return None  # nothing to inherit, nothing inherited to drop
        thresholds |= {key: found[key][0] for key in inherited}
        return config.replace(thresholds=thresholds, inherited_thresholds=inherited)

    written = update_config(index_dir, inherit)
    return {key: written.thresholds[key] for key in written.inherited_thresholds} if written else {}
