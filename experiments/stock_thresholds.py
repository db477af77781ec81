"""Calibrate the abstention thresholds of the stock encoders (all-MiniLM-L6-v2, all-mpnet-base-v2) and store them
in the package's ``retriever/stock_thresholds.json``, keyed by model name with its weights fingerprint: an index built
with a stock encoder starts with its threshold, as one built with a fine-tuned bi-encoder starts with that model's
``threshold.json``. The rule is :mod:`retriever.decisions.abstention`'s (the one ``medfaq train calibrate`` applies).

    python experiments/stock_thresholds.py [--models minilm mpnet] [--from DATA] [--max-queries N] [--out FILE]

Results: docs/experiments/abstention-and-queue.md, "Stock encoder thresholds: a MiniLM or MPNet index abstains out
of the box" (and the package's retriever/stock_thresholds.json).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from medfaq.common.runtime import MedfaqError
from medfaq.eval.script_args import positive_int, print_report
from medfaq.retriever.decisions.abstention import MAX_QUERIES, STOCK_ENCODERS, calibrate_stock
from medfaq.retriever.threshold_files import STOCK_THRESHOLDS, save_stock_threshold


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python experiments/stock_thresholds.py", description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=STOCK_ENCODERS, default=list(STOCK_ENCODERS))
    parser.add_argument("--from", dest="data_from", type=Path, default=None, help="datasets in the shared/data layout")
    parser.add_argument("--seed", type=int, default=0, help="seed of the development questions' sample")
    parser.add_argument(
        "--max-queries", type=positive_int, default=MAX_QUERIES, help="development questions per source (a sample)"
    )
    parser.add_argument("--out", type=Path, default=STOCK_THRESHOLDS, help="the stock threshold file to update")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "experiments/stock_thresholds.py", *(sys.argv[1:] if argv is None else argv)])
    report = {}
    try:
        for name in args.models:
            threshold, fingerprint = calibrate_stock(name, args.data_from, args.seed, args.max_queries)
            save_stock_threshold(name, fingerprint, threshold, command, args.out)
            report[name] = {"threshold": threshold.value, "counts": threshold.counts, **threshold.development}
    except MedfaqError as error:
        sys.exit(f"error: {error}")
    print_report({"stock_thresholds": str(args.out), "models": report})


if __name__ == "__main__":
    main()
