"""Several summaries, not one: the summarizer's n best beams as extra queries, each searched and fused with the raw
question's dense ranking; scored once, every fusion replayed from the stored rankings.

``score``: for each query set (as in `experiments/summary_ranking.py`), the dense top `--depth` of the raw question
and the `--beams` best beams of the summarizer (best first), each searched the same way, stored in
``OUT/<set>.jsonl``; questions already stored are skipped, so an interrupted run resumes.

``replay``: the raw ranking (weight 1) fused by weighted RRF with the rankings of the first `summaries` beams (weight
`weight` each) at constant `k`, the top 10 cut; development sets choose the setting by the rule of
`experiments/summary_ranking.py`, written before any scoring: (1) the highest worst development-set ΔR@1 against
dense search; (2) the fewest development questions lost at rank 1; (3) the largest summed ΔMRR@10; (4) fewer
summaries, then a smaller weight, then a larger k. The test sets are then reported with the chosen setting, and,
not chosen, with the best beam alone fused at equal weight (the pipeline's ``--query both``) and with all beams
fused at equal weight.

    python experiments/summary_queries.py score --summarizer NAME --out DIR [--sets ...] [--beams 4] [--limit N]
    python experiments/summary_queries.py replay --out DIR [--limit N] [--json report.json]

Results: docs/experiments/likelihood-stage.md, "The summarizer as a ranker (issue 42): summary likelihood over the
top hits, and ECL with retrieval negatives", its "Several summaries as extra queries (issue 42, part 3)".
"""

from __future__ import annotations

import argparse
from typing import Any

from medfaq.common.runtime import MedfaqError

if __package__:  # imported as `experiments.summary_queries`
    from .summary_ranking import CUTOFF, fill_stores, replay_report, run_command, summary_commands
else:  # run as `python experiments/summary_queries.py`, its folder first on sys.path
    from summary_ranking import CUTOFF, fill_stores, replay_report, run_command, summary_commands

GRID = {"summaries": (1, 2, 4), "weight": (0.25, 0.5, 1.0), "k": (10, 60)}
BEST_BEAM = {"summaries": 1, "weight": 1.0, "k": 60}
ALL_BEAMS = {"summaries": 4, "weight": 1.0, "k": 60}


def score(args: argparse.Namespace) -> dict[str, Any]:
    from medfaq.retriever.stages.rewrite import locate_summarizer
    from medfaq.summarizer.decoding import Decoding
    from medfaq.summarizer.generation import Summarizer

    if args.beams < 1 or args.depth < 1:
        raise MedfaqError("--beams and --depth must be at least 1")
    model = locate_summarizer(args.summarizer)
    summarizer = Summarizer.load(model)
    decoding = Decoding(num_beams=args.beams, max_length=summarizer.decoding.max_length, mbr=args.beams)

    def row_for(name: str, pipeline: Any, question: str) -> dict[str, Any]:
        beams = summarizer.candidates([question], decoding, batch_size=1)[0]
        return {
            "hits": [hit.to_dict() for hit in pipeline.run(question).hits],
            "summaries": beams,
            "summary_hits": [[hit.id for hit in pipeline.run(beam or question).hits] for beam in beams],
        }

    settings = {"summarizer": str(model), "beams": args.beams, "depth": args.depth}
    return {**settings, "sets": fill_stores(args, settings, row_for)}


def replay_set(rows: list[dict[str, Any]], qrels: dict[str, dict[str, int]], setting: dict[str, Any] | None):
    """Metrics of dense search (`setting` None) or of the raw ranking fused with the beams' rankings, and the ids of
    the questions answered at rank 1."""
    from medfaq.common.ranking import ranking_metrics
    from medfaq.retriever.search import reciprocal_rank_fusion

    run: dict[str, dict[str, float]] = {}
    for row in rows:
        ranking = [hit["id"] for hit in row["hits"]]
        if setting is not None:
            lists = [ranking, *row["summary_hits"][: setting["summaries"]]]
            weights = [1.0] + [setting["weight"]] * (len(lists) - 1)
            fused = reciprocal_rank_fusion([[(i, 0.0) for i in ids] for ids in lists], setting["k"], weights)
            ranking = [doc_id for doc_id, _ in fused]
        run[row["qid"]] = {doc_id: float(CUTOFF - rank) for rank, doc_id in enumerate(ranking[:CUTOFF])}
    metrics, per_query = ranking_metrics(run, {q: qrels[q] for q in run})
    return metrics, {q for q, values in per_query.items() if values["recall@1"] > 0}


def replay(args: argparse.Namespace) -> dict[str, Any]:
    def systems(chosen: dict[str, Any]) -> list[tuple[str, Any]]:
        return [
            ("summaries", chosen),
            ("best beam, equal weight (not chosen)", BEST_BEAM),
            ("4 beams, equal weight (not chosen)", ALL_BEAMS),
        ]

    return replay_report(args, replay_set, GRID, lambda s: (s["summaries"], s["weight"], -s["k"]), systems)


def main(argv: list[str] | None = None) -> None:
    parser, _, scored = summary_commands(
        "python experiments/summary_queries.py",
        __doc__,
        "store the dense rankings of the question and of its best beams",
        "rankings",
    )
    scored.add_argument("--beams", type=int, default=4, help="beams searched and stored per question")
    scored.add_argument("--depth", type=int, default=10, help="hits per ranking")
    run_command(parser.parse_args(argv), {"score": score, "replay": replay})


if __name__ == "__main__":
    main()
