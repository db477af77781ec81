"""`medfaq index rerank DIR`: whether the cross-encoder reranker ranks this bank better than the index's pipeline
without it, decided per index on that bank's development questions, and kept in its ``pipeline.json``.

Development questions as for the likelihood stage (:mod:`retriever.decisions.stage_choice`): the user's labelled ones
required, the questions `medfaq index adapt` held back voting beside them. Each question is searched twice by the
index's own pipeline as it stands (its likelihood stage as decided, abstention off): without the reranker and with
it, at the pipeline's rerank settings (depth, fusion, RRF weight and k, the ``rerank_margin`` gate; where the index
has no gate and no likelihood stage, the gate chosen on development queries, :data:`RERANK_MARGIN`).

The rule, written before any bank was scored (docs/results.md, "Set-up ships the chosen encoder", rule 3):

1. the reranker is turned on only if the worst development set gains at least :data:`MIN_GAIN` point of R@1 over
   the pipeline without it;
2. and only where the reranked pipeline can abstain as the index does: when the index abstains, a threshold for the
   reranked configuration (``dense+rerank@raw``) must be calibrated or inherited from the reranker (one calibrated
   behind this index's encoder); otherwise it stays off and the record says why;
3. (added later, as rule 5 of the likelihood stage's) only golds in the bank itself count, and the labelled
   questions' rank-1 gains must beat their losses by a one-sided sign test at p <= 0.05.

The decision, its numbers, the reranker and the time per question with and without it go to ``reranker.json``
beside the index, which ``index info``, ``/health`` and the demo show.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from medfaq.common.ranking import CUTOFF
from medfaq.common.runtime import utc_timestamp
from medfaq.retriever.decisions import stage_choice
from medfaq.retriever.decisions.stage_choice import choose_on_dev, development_line, rank_metrics
from medfaq.retriever.pipeline import RERANK_MARGIN, PipelineConfig
from medfaq.retriever.pipeline_file import read_config, update_config

CHOICE_FILE = "reranker.json"
COMMAND = "medfaq index rerank"
SETTING_FIELDS = ("rerank_depth", "rerank_fusion", "rerank_retrieval_weight", "rerank_rrf_k", "rerank_margin")
RULE = (
    "labelled development questions required; on only if the worst development set gains >= 1 point of R@1 over "
    "the index's pipeline without the reranker, and a threshold for the reranked configuration exists where the "
    "index abstains; only golds in the bank itself count, and the labelled rank-1 gains must beat the losses by a "
    "one-sided sign test at p <= 0.05"
)


def replay_rows(rows: list[dict[str, Any]], golds: dict[str, frozenset[str]], setting: Any):
    """R@1 and MRR@10 of the stored rankings without the reranker (`setting` None) or with it."""
    return rank_metrics({row["qid"]: row["with" if setting else "without"] for row in rows}, golds)


def ranked_rows(pipelines: dict[str, Any], questions: Sequence[Any], progress: bool = True) -> list[dict[str, Any]]:
    """Each development question's ranked FAQ ids and milliseconds, by each of `pipelines` (``without``, ``with``)."""
    from tqdm.auto import tqdm

    rows = []
    for number, query in enumerate(tqdm(questions, desc="rank", unit="question", disable=not progress)):
        row: dict[str, Any] = {"qid": str(number)}
        for name, pipeline in pipelines.items():
            response = pipeline.run(query.text)
            row[name] = [hit.id for hit in response.hits]
            row[f"{name}_ms"] = response.timings_ms.get("total", 0.0)
        rows.append(row)
    return rows


def choose_reranker(
    directory: Path,
    reranker: str | None = None,
    labelled: Sequence[Any] = (),
    limit: int = 0,
    progress: bool = True,
    log: Callable[[str], None] = print,
    measured_on: Path | None = None,
    stage: Any = None,
) -> dict[str, Any]:
    """Decide the reranker of the index in `directory` by the rule (the module docstring), write the outcome into
    its ``pipeline.json`` and ``reranker.json``, and return the record. `reranker`: a name or directory (None: the
    one `medfaq setup` trains); `stage`: a loaded reranker to use instead (its ``name`` is recorded); `limit` and
    `measured_on` as for :func:`stage_choice.development_sets`."""
    from medfaq.retriever.decisions.abstention import inherit_thresholds
    from medfaq.retriever.model_cache import build_pipeline
    from medfaq.retriever.pipeline import Pipeline
    from medfaq.retriever.stages.rerank import locate_reranker

    directory = Path(directory).expanduser()
    started = time.perf_counter()
    location = stage.name if stage is not None else locate_reranker(reranker)  # a wrong name fails first
    index, sets = stage_choice.development_sets(directory, labelled, COMMAND, limit, log, measured_on)
    saved = read_config(directory)
    if saved.rerank_margin is None and not saved.likelihood:  # the gate shared with the likelihood stage stays
        saved = saved.replace(rerank_margin=RERANK_MARGIN)
    measured = saved.replace(top_k=CUTOFF, abstain=False, log_unanswered=False, entities=False, reranker=location)
    without = build_pipeline(index, measured.replace(rerank=False))
    if stage is None:
        with_reranker = build_pipeline(index, measured.replace(rerank=True))
    else:
        stages = {"rewriter": without.rewriter, "likelihood": without.likelihood}
        with_reranker = Pipeline(index, measured.replace(rerank=True), reranker=stage, **stages)
    pipelines = {"without": without, "with": with_reranker}
    dev = {}
    for name, queries in sets.items():
        log(f"{name}: ranking {len(queries)} development questions without and with the reranker")
        rows = ranked_rows(pipelines, queries, progress)
        dev[name] = (rows, {row["qid"]: queries[int(row["qid"])].golds for row in rows})
    candidates, before = choose_on_dev(dev, replay_rows, [{"rerank": True}], tie_break=lambda _: 0)
    best = candidates[0]
    refused = stage_choice.refusal(best)
    wins = refused is None
    threshold_key = measured.replace(rerank=True).threshold_key
    if wins and saved.abstain:
        inherit_thresholds(directory, index.manifest.encoder, location)
    thresholds = read_config(directory).thresholds
    can_abstain = not saved.abstain or saved.threshold is not None or threshold_key in thresholds
    turned_on = wins and can_abstain
    if turned_on:
        why = "it wins on every development set"
    elif wins:
        why = (
            f"it wins, but the index abstains and has no threshold for {threshold_key}: calibrate one "
            "(`medfaq eval retrieval --save-threshold`) or use a reranker calibrated behind this index's encoder"
        )
    else:
        why = str(refused)
    every_row = [row for rows, _ in dev.values() for row in rows]
    record = {
        "decided": utc_timestamp(),
        "on": turned_on,
        "why": why,
        "reranker": location,
        "rule": RULE,
        "setting": {field: getattr(saved, field) for field in SETTING_FIELDS},
        "likelihood": saved.likelihood,
        "development": stage_choice.development_summary(best, before, dev),
        "ms_per_question": {
            name: round(sum(row[f"{name}_ms"] for row in every_row) / max(len(every_row), 1), 1) for name in pipelines
        },
        "measured_on": str(measured_on or directory),
        "encoder_fingerprint": index.manifest.encoder_fingerprint,
        "seconds": round(time.perf_counter() - started, 1),
    }
    chosen = {"reranker": location, "rerank_margin": saved.rerank_margin} if turned_on else {}
    update_config(directory, lambda current: (current or PipelineConfig()).replace(rerank=turned_on, **chosen))
    write_choice(directory, record)
    return record


def write_choice(directory: Path, record: dict[str, Any]) -> None:
    stage_choice.write_record(Path(directory) / CHOICE_FILE, record)


def read_choice(directory: str | Path) -> dict[str, Any] | None:
    """The index's recorded reranker decision (None when it has none, or the file cannot be read)."""
    return stage_choice.read_record(Path(directory) / CHOICE_FILE)


def decided_for(directory: str | Path, reranker: Path) -> bool:
    """Whether the index has a reranker decision made with the encoder that encodes it now and with `reranker`."""
    record = read_choice(directory)
    return stage_choice.decided_for_encoder(directory, record) and Path(record["reranker"]) == Path(reranker)


def turn_off(directory: Path) -> None:
    """The reranker off in the index's ``pipeline.json``; the record says it was turned off by hand."""
    update_config(directory, lambda saved: (saved or PipelineConfig()).replace(rerank=False))
    record = read_choice(directory)
    if record is not None:
        write_choice(directory, {**record, "on": False, "turned_off": utc_timestamp()})


def stale_note(record: dict[str, Any], fingerprint: str) -> str:
    """What `index info` adds to a decision that does not hold for the index's encoder now."""
    return stage_choice.stale_note(record, fingerprint, COMMAND)


def describe_choice(record: dict[str, Any]) -> str:
    """One line: the decision, its gate, the development numbers, the cost per question and the reranker."""
    gate = record["setting"]["rerank_margin"]
    cost = record.get("ms_per_question", {})
    timing = f"; {cost['without']:.0f} -> {cost['with']:.0f} ms per question" if cost else ""
    return (
        f"reranker {'on' if record['on'] else 'off'} ({record['decided']}): depth {record['setting']['rerank_depth']}, "
        f"gate {gate if gate else 'off'}; {development_line(record)}{timing}; {record['reranker']}"
    )
