"""Two systems' TREC runs on one benchmark, paired question by question: how many test questions each answers at
rank 1 where the other does not, and the one-sided sign test of the second against the first (the test the per-index
stage decisions use, `retriever.decisions.stage_choice.sign_test`). Produced the "fine-tuned over stock MPNet" pairs of
docs/results.md's summary:

    python experiments/paired_rank1.py BENCH_DIR STOCK_RUN.trec TUNED_RUN.trec
"""

from __future__ import annotations

import argparse

from medfaq.common.ranking import read_trec_run
from medfaq.eval.benchmarks import Benchmark
from medfaq.retriever.decisions.stage_choice import sign_test


def first_hits(path: str) -> dict[str, str]:
    """Each question's top-ranked FAQ id in a TREC run."""
    return {qid: max(scores, key=scores.get) for qid, scores in read_trec_run(path).items() if scores}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("benchmark", help="A `medfaq data make-benchmark` directory.")
    parser.add_argument("first", help="The TREC run of the system compared against.")
    parser.add_argument("second", help="The TREC run of the system tested.")
    args = parser.parse_args()
    benchmark = Benchmark.load(args.benchmark)
    dev = benchmark.dev_ids
    judged = {qid: golds for qid, golds in benchmark.qrels.items() if qid not in dev}
    first, second = first_hits(args.first), first_hits(args.second)
    won = sum(second.get(q) in golds and first.get(q) not in golds for q, golds in judged.items())
    lost = sum(first.get(q) in golds and second.get(q) not in golds for q, golds in judged.items())
    print(
        f"{benchmark.name}: {len(judged)} test questions; the second right at rank 1 where the first is wrong: "
        f"{won}, the other way: {lost}; one-sided sign test p = {sign_test(won, lost):.3g}"
    )


if __name__ == "__main__":
    main()
