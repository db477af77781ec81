"""`medfaq index likelihood DIR`: whether the summarizer's likelihood stage ranks this bank better than the index's
pipeline without it, decided per index on that bank's development questions, and kept in its ``pipeline.json``.

Development questions (with the FAQ ids that answer them): the user's labelled ones, beside which the questions
`medfaq index adapt` wrote and held back for this bank (``development.jsonl`` in its work directory) vote; a bank
without labelled ones stays as it is (rule 3). Each question is searched once by the index's own pipeline with the
likelihood, the cross-encoder and abstention off (its top `depth` hits), and each hit is scored once by the
summarizer, given the question and given none; every setting of :data:`GRID` is then replayed from those scores
through the pipeline's own rescoring (:meth:`Pipeline.rescore`).

The rule, written before any bank was scored:

1. order the settings by the worst development set's ΔR@1 against the pipeline without the stage, then by the
   fewest questions lost at rank 1, then by the largest summed ΔMRR@10, then the gate on before off, the smaller
   weight and the larger RRF k (the stage acting least);
2. turn the stage on with the first setting only if that worst ΔR@1 is at least :data:`MIN_GAIN` points: every
   development set gains more questions at rank 1 than it loses. Otherwise the stage is turned off.
3. (added after the first measurement, docs/results.md) generated questions alone never turn it on: on COVID-Q they
   gained 2.6 points while the bank's real questions lost 2.5. Labelled questions are required; generated ones
   vote beside them.
4. (added when `medfaq setup` began to train the rank model with three seeds, whose gains had varied from +1.5 to
   +9.4 test R@1 with the seed alone) among several summarizers, each gets its setting by rules 1-3 and the one
   whose setting orders first by rule 1's order is kept, the first listed on a tie.
5. (added when a stage decided on medquad-chq lost on real consumer questions judged against real MedQuAD FAQs,
   docs/results.md) only judgments pointing into the bank itself are evidence: a labelled question whose gold FAQs
   exist only in the copy it is measured on is left out; and the labelled questions' rank-1 gains must beat their
   losses by a one-sided sign test at p <= 0.05 (:func:`retriever.decisions.stage_choice.refusal`), so that a handful of
   questions cannot turn the stage on.

The decision, every development number and the summarizer it was measured with go to ``likelihood.json`` beside
the index (kept across index saves), which ``index info``, ``/health`` and the demo show.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from medfaq.common.runtime import utc_timestamp
from medfaq.retriever.decisions import stage_choice
from medfaq.retriever.decisions.stage_choice import choose_on_dev, development_line, rank_metrics
from medfaq.retriever.pipeline import RERANK_MARGIN, PipelineConfig
from medfaq.retriever.pipeline_file import update_config

CHOICE_FILE = "likelihood.json"
COMMAND = "medfaq index likelihood"
GRID = {
    "likelihood_per_token": (True, False),
    "likelihood_prior": (0.0, 0.5, 1.0),
    "likelihood_weight": (0.5, 1.0, 2.0, 3.0, 4.5, 6.0, 1000.0),  # against the retrieval ranking's 3; 1000: alone
    "rerank_rrf_k": (10, 60),
    "rerank_margin": (RERANK_MARGIN, None),  # the gate on (only questions whose top two cosines are close) or off
}
RULE = (
    "labelled development questions required; on only if the worst development set gains >= 1 point of R@1; "
    "settings ordered by worst dR@1, fewest lost at rank 1, summed dMRR@10, gate on, smaller weight, larger k; "
    "among several summarizers, the one whose setting orders first (the first listed on a tie); only golds in the "
    "bank itself count, and the labelled rank-1 gains must beat the losses by a one-sided sign test at p <= 0.05"
)


class StoredScores:
    """A likelihood stage answering from stored scores: per question text, its hits' FAQ questions and their
    summed log-probabilities given the question and given none, with their token counts."""

    def __init__(self, rows: Sequence[dict[str, Any]]) -> None:
        from medfaq.summarizer.likelihood import TokenScores

        self.stored = {
            row["text"]: (
                [hit["question"] for hit in row["hits"]],
                TokenScores(_array(row["given"]), _array(row["tokens"])),
                TokenScores(_array(row["prior"]), _array(row["tokens"])),
            )
            for row in rows
        }

    def score(self, query: str, candidates: list[str], prior_weight: float, per_token: bool) -> list[float]:
        from medfaq.summarizer.likelihood import combine

        texts, given, prior = self.stored[query]
        scores = combine(given, prior, prior_weight, per_token)
        return [float(scores[texts.index(text)]) for text in candidates]


def _array(values: list[float]) -> Any:
    import numpy as np

    return np.array(values, dtype=np.float64)


def tie_break(setting: dict[str, Any]) -> tuple:
    """The stage acting least first: the gate on, the smaller weight, the larger k."""
    return (setting.get("rerank_margin") is None, setting["likelihood_weight"], -setting["rerank_rrf_k"])


def grid_settings(grid: dict[str, tuple] = GRID) -> list[dict[str, Any]]:
    return [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]


def replay_golds(rows: list[dict[str, Any]], golds: dict[str, frozenset[str]], changes: dict[str, Any] | None):
    """R@1 and MRR@10 (in %) of the stored hits as retrieved (`changes` None) or rescored with the likelihood stage
    set by `changes`, and the ids of the questions answered at rank 1; `golds`: the relevant FAQ ids by row id."""
    ranked = {row["qid"]: [hit.id for hit in hits] for row, hits in zip(rows, replayed(rows, changes), strict=True)}
    return rank_metrics(ranked, golds)


def replayed(rows: list[dict[str, Any]], changes: dict[str, Any] | None) -> list[list[Any]]:
    """Each stored row's hits as retrieved (`changes` None), or rescored by a pipeline (reading no index) whose
    likelihood stage, set by `changes`, answers from the stored scores."""
    from medfaq.retriever.pipeline import Pipeline, PipelineConfig
    from medfaq.retriever.search import Hit

    hits = [[Hit(**hit) for hit in row["hits"]] for row in rows]
    if changes is None:
        return hits
    depth = max(len(row["hits"]) for row in rows)
    config = PipelineConfig(likelihood=True, likelihood_depth=depth, abstain=False, log_unanswered=False, **changes)
    pipeline = Pipeline(_NO_INDEX, config, likelihood=StoredScores(rows))
    return [pipeline.rescore(row["text"], row["text"], found, {}) for row, found in zip(rows, hits, strict=True)]


_NO_INDEX: Any = object()  # a replay's pipeline only rescores stored hits: it reads no index


def first_stage_config(directory: Path, depth: int) -> Any:
    """The index's own pipeline config with the likelihood, the cross-encoder, abstention and the entity stage off,
    ranking `depth` hits: the hits the likelihood is scored on."""
    from medfaq.retriever.pipeline_file import read_config

    return read_config(directory).replace(
        top_k=depth, abstain=False, log_unanswered=False, entities=False, rerank=False, likelihood=False
    )


def first_stage_hits(pipeline: Any, questions: Sequence[Any], progress: bool = True) -> list[list[Any]]:
    """Each development question's hits by the first stage (searched once, whatever number of summarizers scores
    them)."""
    from tqdm.auto import tqdm

    return [
        pipeline.run(query.text).hits for query in tqdm(questions, desc="search", unit="question", disable=not progress)
    ]


def score_rows(
    scorer: Any, questions: Sequence[Any], found: Sequence[list[Any]], progress: bool = True
) -> list[dict[str, Any]]:
    """Each development question's first-stage hits (`found`, in the questions' order) and their stored likelihood
    scores (given it, given none)."""
    from tqdm.auto import tqdm

    rows = []
    pairs = zip(questions, found, strict=True)
    for number, (query, hits) in enumerate(
        tqdm(pairs, total=len(questions), desc="score", unit="question", disable=not progress)
    ):
        texts = [hit.question for hit in hits]
        given = scorer.token_scores(query.text, texts) if texts else None
        prior = scorer.prior_scores(texts) if texts else None
        rows.append(
            {
                "qid": str(number),
                "text": query.text,
                "hits": [hit.to_dict() for hit in hits],
                "given": given.log_prob.tolist() if given else [],
                "tokens": given.tokens.tolist() if given else [],
                "prior": prior.log_prob.tolist() if prior else [],
            }
        )
    return [row for row in rows if row["hits"]]


def choose_likelihood(
    directory: Path,
    summarizers: Sequence[str | None] = (None,),
    labelled: Sequence[Any] = (),
    depth: int = 10,
    limit: int = 0,
    progress: bool = True,
    log: Callable[[str], None] = print,
    scorers: Sequence[Any] = (),
    measured_on: Path | None = None,
) -> dict[str, Any]:
    """Decide the likelihood stage of the index in `directory` by the rule (the module docstring), write the
    outcome into its ``pipeline.json`` and ``likelihood.json``, and return the record. With several `summarizers`
    (seeds of one recipe, say) each gets its own setting by the rule, and the one whose setting orders first by the
    rule's order is kept, the first listed on a tie (None: the best one trained). `limit`: score only the first N
    questions of each development set (0: all); `scorers`: loaded :class:`SummaryLikelihood` stages instead of the
    `summarizers`; `measured_on`: search the questions in this index instead, encoded by the same model (the bank
    with the labelled questions' gold FAQs added, as a benchmark over it holds them). Questions whose gold FAQs are
    not in the searched index are left out."""
    from medfaq.retriever.pipeline import Pipeline
    from medfaq.retriever.stages.rewrite import locate_summarizer

    directory = Path(directory).expanduser()
    started = time.perf_counter()
    # a wrong name fails before anything loads
    models = [] if scorers else [locate_summarizer(summarizer) for summarizer in summarizers]
    # rule 3: generated questions alone never turn the stage on
    index, sets = stage_choice.development_sets(directory, labelled, COMMAND, limit, log, measured_on)
    config = first_stage_config(directory, depth)
    first_stage = Pipeline(index, config)
    found = {name: first_stage_hits(first_stage, queries, progress) for name, queries in sets.items()}
    bank = [record.question for record in index.records()]
    outcomes = []
    for scorer in scorers or (_load_scorer(model, config) for model in models):
        scorer.keep(bank)
        dev = {}
        for name, queries in sets.items():
            log(f"{name}: scoring the top {depth} of {len(queries)} development questions with {scorer.name}")
            rows = score_rows(scorer, queries, found[name], progress)
            dev[name] = (rows, {row["qid"]: queries[int(row["qid"])].golds for row in rows})
        candidates, before = choose_on_dev(dev, replay_golds, grid_settings(), tie_break)
        outcomes.append(
            {
                "summarizer": scorer.name,
                "precision": scorer.precision,
                "best": candidates[0],
                "dev": dev,
                "before": before,
                "settings_scored": len(candidates),
            }
        )
    chosen = min(outcomes, key=lambda outcome: stage_choice.rule_order(outcome["best"]))  # min: the first on a tie
    best, dev, before = chosen["best"], chosen["dev"], chosen["before"]
    location = chosen["summarizer"]
    refused = stage_choice.refusal(best)
    turned_on = refused is None
    setting = {**best["setting"], "likelihood_depth": depth}
    record = {
        "decided": utc_timestamp(),
        "on": turned_on,
        "why": refused or "it wins on every development set",
        "summarizer": location,
        "vocabulary": config.likelihood_vocabulary,
        "precision": chosen["precision"],
        "rule": RULE,
        "setting": setting,
        "development": stage_choice.development_summary(best, before, dev),
        "settings_scored": chosen["settings_scored"],
        "summarizers_scored": [
            {
                "summarizer": outcome["summarizer"],
                "setting": outcome["best"]["setting"],
                "development": stage_choice.development_summary(outcome["best"], outcome["before"], outcome["dev"]),
            }
            for outcome in outcomes
        ],
        "measured_on": str(measured_on or directory),
        "encoder_fingerprint": index.manifest.encoder_fingerprint,
        "seconds": round(time.perf_counter() - started, 1),
    }

    def decided(saved: Any) -> Any:
        saved = saved or PipelineConfig()
        if not turned_on:
            return saved.replace(likelihood=False)
        return saved.replace(likelihood=True, summarizer=location, **setting)

    update_config(directory, decided)
    write_choice(directory, record)
    return record


def _load_scorer(model: str, config: Any) -> Any:
    from medfaq.summarizer.likelihood import SummaryLikelihood

    return SummaryLikelihood.load(model, vocabulary=config.likelihood_vocabulary, precision=config.likelihood_precision)


def write_choice(directory: Path, record: dict[str, Any]) -> None:
    stage_choice.write_record(Path(directory) / CHOICE_FILE, record)


def turn_off(directory: Path) -> None:
    """The stage off in the index's ``pipeline.json``; the record says it was turned off by hand."""
    update_config(directory, lambda saved: (saved or PipelineConfig()).replace(likelihood=False))
    record = read_choice(directory)
    if record is not None:
        write_choice(directory, {**record, "on": False, "turned_off": utc_timestamp()})


def read_choice(directory: str | Path) -> dict[str, Any] | None:
    """The index's recorded likelihood decision (None when it has none, or the file cannot be read)."""
    return stage_choice.read_record(Path(directory) / CHOICE_FILE)


def decided_for_encoder(directory: str | Path) -> bool:
    """Whether the index has a likelihood decision made with the encoder that encodes it now."""
    return stage_choice.decided_for_encoder(directory, read_choice(directory))


def decided_among(directory: str | Path, summarizers: Sequence[Path]) -> bool:
    """Whether the index has a likelihood decision made with the encoder that encodes it now and with every one of
    `summarizers` scored."""
    record = read_choice(directory)
    if record is None or not stage_choice.decided_for_encoder(directory, record):
        return False
    scored = record.get("summarizers_scored", [{"summarizer": record["summarizer"]}])
    return {Path(path).expanduser().resolve() for path in summarizers} <= {
        Path(entry["summarizer"]).expanduser().resolve() for entry in scored
    }


def stale_note(record: dict[str, Any], fingerprint: str) -> str:
    """What `index info` adds to a decision that does not hold for the index's encoder now."""
    return stage_choice.stale_note(record, fingerprint, COMMAND)


def describe_choice(record: dict[str, Any]) -> str:
    """One line: the decision, its setting, the development numbers and the summarizer."""
    setting = record["setting"]
    how = (
        f"weight {setting['likelihood_weight']}, prior {setting['likelihood_prior']}, "
        f"{'per token' if setting['likelihood_per_token'] else 'summed'}, k {setting['rerank_rrf_k']}, "
        f"depth {setting['likelihood_depth']}, gate {setting['rerank_margin'] if setting['rerank_margin'] else 'off'}"
    )
    state = "on" if record["on"] else "off"
    measured = f" ({record['precision']})" if "precision" in record else ""
    among = len(record.get("summarizers_scored", ()))
    chosen = f" (the best of {among} scored)" if among > 1 else ""
    return (
        f"likelihood stage {state} ({record['decided']}): {how}; {development_line(record)}; "
        f"summarizer {record['summarizer']}{measured}{chosen}"
    )
