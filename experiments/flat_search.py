"""A flat FAISS index's two-pass search (fp16 scan, then float32) against FAISS's own float32 search, on real
questions: how often the best FAQ and the whole top k agree, the largest score difference, and milliseconds per
query on one thread.

    python experiments/flat_search.py --index ~/.medfaq/indexes/medquad-faq --queries Q.jsonl --limit 200

Results: docs/experiments/speed.md, "The encoder in bf16 where the CPU multiplies bf16 fast (issue 52: the speed of
fine-tuned MPNet)".
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from medfaq.eval.script_args import existing_file, positive_int, report_or_error


def compare(index_dir: Path, questions: list[str], k: int = 50) -> dict[str, Any]:
    """Both searches of every question's vector (encoded by the index's encoder) over the index at `index_dir`."""
    import faiss

    from medfaq.common.runtime import MedfaqError
    from medfaq.index.faiss_store import FaissStore
    from medfaq.index.faq_index import FaqIndex

    index = FaqIndex.load(index_dir)
    store = index.store
    two_pass = store.two_pass_scan() if isinstance(store, FaissStore) else None
    if two_pass is None:
        raise MedfaqError(f"{index_dir} is not a flat FAISS index searched in two passes (20,000 vectors or more)")
    vectors = index.encoder.encode(questions)
    faiss.omp_set_num_threads(1)
    same_top1 = same_list = 0
    largest = 0.0
    seconds = {"float32": 0.0, "two_pass": 0.0}
    for vector in vectors:
        start = time.perf_counter()
        exact_scores, exact_keys = store.parts[0].search(vector[None], k)
        middle = time.perf_counter()
        scores, keys = two_pass.search(vector[None], k)
        seconds["float32"] += middle - start
        seconds["two_pass"] += time.perf_counter() - middle
        same_top1 += int(exact_keys[0, 0] == keys[0, 0])
        same_list += int(exact_keys[0].tolist() == keys[0].tolist())
        largest = max(largest, float(np.abs(exact_scores - scores).max()))
    count = len(vectors)
    return {
        "queries": count,
        "k": k,
        "same_best_faq": same_top1,
        "same_top_k": same_list,
        "largest_score_difference": largest,
        "ms_per_query_float32": 1000 * seconds["float32"] / count,
        "ms_per_query_two_pass": 1000 * seconds["two_pass"] / count,
    }


def main(argv: Sequence[str] | None = None) -> int:
    from medfaq.retriever.runs import read_queries

    parser = argparse.ArgumentParser(prog="python experiments/flat_search.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", type=Path, required=True, help="A flat FAISS index of 20,000 FAQs or more.")
    parser.add_argument("--queries", type=existing_file, required=True, help="JSONL questions (BEIR `text`).")
    parser.add_argument("--limit", type=positive_int, default=200, help="Use the first N questions.")
    parser.add_argument("--k", type=positive_int, default=50, help="Hits per query.")
    parser.add_argument("--out", type=Path, help="Also write the JSON report here.")
    args = parser.parse_args(argv)

    def report() -> dict[str, Any]:
        return compare(args.index, read_queries(args.queries).questions[: args.limit], args.k)

    return report_or_error(report, args.out)


if __name__ == "__main__":
    sys.exit(main())
