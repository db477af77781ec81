"""What the per-index stage decisions share (`medfaq index likelihood`: retriever/decisions/likelihood_choice.py;
`medfaq index rerank`: retriever/decisions/reranker_choice.py): the development sets a bank is decided on, the rule's
ordering of settings by what they gain there, and the decision record kept beside the index.

Development sets: the user's labelled questions (required: generated questions alone never turn a stage on), and
beside them the questions `medfaq index adapt` wrote and held back for this bank (``development.jsonl`` in its work
directory). A stage is turned on only if the worst development set gains at least :data:`MIN_GAIN` points of R@1
and the labelled questions it moves at rank 1 gain more than they lose by a one-sided sign test at
:data:`SIGNIFICANCE` (:func:`refusal`). Only judgments that point into the bank itself are evidence: a labelled
question whose gold FAQs exist only in the copy it is measured on (FAQs inserted for a benchmark, such as
medquad-chq's reference summaries) is left out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from medfaq.common.ranking import first_hits
from medfaq.common.runtime import MedfaqError

MIN_GAIN = 1.0  # points of R@1 the worst development set must gain for a stage to be turned on
SIGNIFICANCE = 0.05  # the labelled questions' rank-1 gains against losses, one-sided sign test

Replay = Callable[[list[dict[str, Any]], Any, Any], tuple[dict[str, float], set[str]]]
"""(stored rows, judgements, a setting or None for the pipeline without the stage) -> (metrics with ``recall@1`` and
``mrr@10``, ids of the questions answered at rank 1)."""


def choose_on_dev(
    dev: dict[str, tuple[list, Any]], replay_one: Replay, settings: list[dict], tie_break
) -> tuple[list[dict], dict[str, dict[str, float]]]:
    """Every setting scored against the pipeline without the stage on each development set, ordered by the worst
    set's ΔR@1, then the fewest questions lost at rank 1, then the largest summed ΔMRR@10, then `tie_break(setting)`
    (a sort key): the chosen setting first; and the metrics without the stage."""
    base = {name: replay_one(rows, judged, None) for name, (rows, judged) in dev.items()}
    candidates = []
    for setting in settings:
        cells = {}
        for name, (rows, judged) in dev.items():
            metrics, firsts = replay_one(rows, judged, setting)
            before, before_firsts = base[name]
            cells[name] = {
                "delta_r1": metrics["recall@1"] - before["recall@1"],
                "delta_mrr": metrics["mrr@10"] - before["mrr@10"],
                "lost": len(before_firsts - firsts),
                "gained": len(firsts - before_firsts),
            }
        candidates.append(
            {
                "setting": setting,
                "sets": cells,
                "worst_delta_r1": min(c["delta_r1"] for c in cells.values()),
                "lost": sum(c["lost"] for c in cells.values()),
                "summed_delta_mrr": sum(c["delta_mrr"] for c in cells.values()),
            }
        )
    candidates.sort(key=lambda candidate: (*rule_order(candidate), tie_break(candidate["setting"])))
    return candidates, {name: metrics for name, (metrics, _) in base.items()}


def sign_test(gained: int, lost: int) -> float:
    """One-sided p-value of at least `gained` wins among `gained + lost` changed questions if each change were a fair
    coin (1.0 when nothing changed)."""
    changed = gained + lost
    return sum(math.comb(changed, wins) for wins in range(gained, changed + 1)) / 2**changed if changed else 1.0


def refusal(candidate: dict[str, Any]) -> str | None:
    """Why the rule's first setting (`choose_on_dev`) may not turn its stage on, or None where it may: the worst
    development set gains less than :data:`MIN_GAIN` points of R@1, or the labelled questions' rank-1 gains against
    losses are too few to conclude (:func:`sign_test` above :data:`SIGNIFICANCE`)."""
    if candidate["worst_delta_r1"] < MIN_GAIN:
        return f"the worst development set gains less than {MIN_GAIN:g} point of R@1"
    labelled = candidate["sets"]["labelled"]
    p_value = sign_test(labelled["gained"], labelled["lost"])
    if p_value > SIGNIFICANCE:
        return (
            f"the labelled questions gain {labelled['gained']} and lose {labelled['lost']} at rank 1: too few to "
            f"conclude (one-sided sign test p = {p_value:.2f} > {SIGNIFICANCE:g})"
        )
    return None


def rule_order(candidate: dict[str, Any]) -> tuple[float, int, float]:
    """The sort key of a scored setting (`choose_on_dev`), best first: the worst development set's ΔR@1, the fewest
    questions lost at rank 1, the largest summed ΔMRR@10."""
    return -candidate["worst_delta_r1"], candidate["lost"], -candidate["summed_delta_mrr"]


def rank_metrics(ranked: dict[str, list[str]], golds: dict[str, frozenset[str]]) -> tuple[dict[str, float], set[str]]:
    """R@1 and MRR@10 (in %) of each question's ranked FAQ ids (by question id) against its relevant ones, and the
    ids of the questions answered at rank 1."""
    recall_at_1, mrr, firsts = first_hits(ranked, golds)
    return {"recall@1": recall_at_1, "mrr@10": mrr}, firsts


def development_questions(directory: Path) -> list[Any]:
    """The questions `medfaq index adapt` held back for this bank (none when it has not run)."""
    from medfaq.retriever.decisions.adaptation import DEVELOPMENT_FILE, DevQuery, work_dir

    path = work_dir(directory) / DEVELOPMENT_FILE
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [DevQuery(row["text"], frozenset(row["golds"])) for row in rows]


def development_sets(
    directory: Path,
    labelled: Sequence[Any],
    command: str,
    limit: int = 0,
    log: Callable[[str], None] = print,
    measured_on: Path | None = None,
) -> tuple[Any, dict[str, list[Any]]]:
    """The index the questions are searched in (`measured_on`, a copy of `directory` encoded by the same model, or
    `directory` itself) and the development sets: ``labelled`` (required; `command` names the decision in its
    error) and ``generated`` where `medfaq index adapt` held questions back. Questions whose gold FAQs are not in
    that index are left out, and labelled ones whose gold FAQs are only in the copy (inserted into it: no evidence
    about this bank); `limit`: only the first N of each set (0: all)."""
    from medfaq.index.faq_index import FaqIndex
    from medfaq.index.storage import read_manifest

    fingerprint = read_manifest(directory).encoder_fingerprint  # not an index: its one-line error first
    if not labelled:  # generated questions alone never turn a stage on
        raise MedfaqError(
            f"no labelled development questions for {directory}: give {command} --dev-queries/--dev-qrels (the "
            "questions `medfaq index adapt` held back vote beside them, never alone); the index stays as it is"
        )
    sets = {"labelled": list(labelled)}
    generated = development_questions(directory)
    if generated:
        sets["generated"] = generated
    index = FaqIndex.load(measured_on or directory)
    if measured_on is not None and index.manifest.encoder_fingerprint != fingerprint:
        raise MedfaqError(f"{measured_on} is not encoded by the model of {directory}; measure on a copy of it")
    for name, queries in sets.items():
        answerable = [query for query in queries if any(faq_id in index for faq_id in query.golds)]
        if len(answerable) < len(queries):
            missing = len(queries) - len(answerable)
            log(f"{name}: left out {missing} of {len(queries)} questions (no gold FAQ in the index)")
        if name == "labelled" and measured_on is not None:
            bank = FaqIndex.load(directory)
            inserted = [query for query in answerable if not any(faq_id in bank for faq_id in query.golds)]
            if inserted:
                log(
                    f"{name}: left out {len(inserted)} of {len(answerable)} questions whose gold FAQs are only in "
                    f"{measured_on} (inserted there: no evidence about {directory})"
                )
                answerable = [query for query in answerable if query not in inserted]
        sets[name] = answerable[:limit] if limit else answerable
    return index, sets


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write a decision record atomically (a reader never sees half of it)."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def read_record(path: Path) -> dict[str, Any] | None:
    """A recorded decision (None when there is none, or the file cannot be read)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def decided_for_encoder(directory: str | Path, record: dict[str, Any] | None) -> bool:
    """Whether `record` was decided with the encoder that encodes the index in `directory` now (a rebuild with
    another encoder keeps ``pipeline.json`` and the records, which then describe another first stage)."""
    from medfaq.index.storage import is_index, read_manifest

    if record is None or not is_index(directory):
        return False
    return record.get("encoder_fingerprint") == read_manifest(Path(directory)).encoder_fingerprint


def stale_note(record: dict[str, Any], fingerprint: str, command: str) -> str:
    """What `index info` adds to a decision `record` that does not hold for the index's encoder now (its
    `fingerprint`), naming the `command` that decides again; empty when it holds."""
    if "encoder_fingerprint" not in record:
        return "; the encoder it was measured with is not recorded"
    if record["encoder_fingerprint"] != fingerprint:
        return f"; measured with another encoder than the index's: decide again (`{command}`)"
    return ""


def development_line(record: dict[str, Any]) -> str:
    """The development numbers of a decision, e.g. ``labelled R@1 60.0 -> 66.4 (140 questions)``."""
    parts = []
    for name, cell in record["development"].items():
        before = cell["before"]["recall@1"]
        parts.append(f"{name} R@1 {before:.1f} -> {before + cell['delta_r1']:.1f} ({cell['questions']} questions)")
    return "; ".join(parts)


def development_summary(candidate: dict[str, Any], before: dict[str, dict[str, float]], dev: dict) -> dict:
    """The record's ``development`` part: per set, its size, the metrics without the stage and the chosen
    `candidate`'s changes (ΔR@1, ΔMRR@10, questions lost and gained at rank 1)."""
    return {
        name: {"questions": len(rows), "before": before[name], **candidate["sets"][name]}
        for name, (rows, _) in dev.items()
    }
