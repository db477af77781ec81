"""Encoder backends side by side (PyTorch fp32, ONNX Runtime fp32, ONNX Runtime int8, and OpenVINO running the same
fp32 export in f32 or bf16 where `pip install openvino` put it) on this CPU: load time,
milliseconds per single-question encode, texts per second (wall and per CPU second) encoding a corpus, and dense
retrieval quality (Recall@1, MRR@10 on the judged test queries of a `medfaq data make-benchmark` directory).

Retrieval is exact cosine search over the corpus' question texts encoded without synonyms, so rows differ only by
the backend. `--build COLLECTION` adds the index build estimate: texts per second on a sample of the texts
`medfaq index build COLLECTION` encodes (with the synonym expansions `--synonyms` asks for), and the minutes the
whole collection would take.

    python experiments/encoder_backends.py --model minilm --benchmark /tmp/rqe-test --build medquad

Results:

* docs/experiments/speed.md, "The bi-encoder on ONNX Runtime (issue 43: backends, start-up, build speed)"
* docs/experiments/speed.md, "int8 graphs checked against their fp32 source (issue 56): all-mpnet-base-v2 on ONNX
  Runtime int8"
* docs/experiments/speed.md, "The encoder in bf16 where the CPU multiplies bf16 fast (issue 52: the speed of
  fine-tuned MPNet)"
* docs/experiments/biencoder.md, "The strongest encoder we can ship (issue 52, first part): stock encoders, covid-q,
  and one distilled student"
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from medfaq.common.runtime import ENCODER_BACKENDS, MedfaqError
from medfaq.eval.script_args import positive_int, print_report

BACKENDS = tuple(backend for backend in ENCODER_BACKENDS if backend != "auto")
OPENVINO_HINTS = {"openvino": "f32", "openvino-bf16": "bf16"}
"""Comparison-only rows: OpenVINO's inference precision for the ONNX fp32 export (the int8 graph holds ONNX Runtime
operators OpenVINO cannot convert)."""
LATENCY_QUERIES = 100  # single-question encodes timed per backend
WARM_UP = 5
TOP_K = 10


@dataclass
class Throughput:
    """Texts encoded per wall second and per CPU second of this process (all its threads)."""

    texts: int
    wall_s: float
    cpu_s: float

    @classmethod
    def measure(cls, encoder: Any, texts: list[str]) -> tuple[Throughput, np.ndarray]:
        wall, cpu = time.perf_counter(), time.process_time()
        vectors = encoder.encode(texts)
        return cls(len(texts), time.perf_counter() - wall, time.process_time() - cpu), vectors

    def row(self, prefix: str) -> dict[str, float]:
        return {
            f"{prefix}_texts_per_s": self.texts / self.wall_s,
            f"{prefix}_texts_per_cpu_s": self.texts / max(self.cpu_s, 1e-9),
        }


class OpenVinoSession:
    """OpenVINO's compiled model behind the ``run(None, feed) -> [output]`` call of an ONNX Runtime session."""

    def __init__(self, path: Path, hint: str) -> None:
        import os

        try:
            import openvino
        except ImportError:
            raise MedfaqError("the openvino rows need OpenVINO: pip install openvino") from None
        threads = os.environ.get("OMP_NUM_THREADS", "")
        config = {"INFERENCE_PRECISION_HINT": hint, **({"INFERENCE_NUM_THREADS": threads} if threads.isdigit() else {})}
        self.model = openvino.Core().compile_model(str(path), "CPU", config)
        self.request = self.model.create_infer_request()

    def run(self, _outputs: None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(self.request.infer(feed)[self.model.outputs[0]])]


def load_for_comparison(model: str, backend: str) -> Any:
    """The encoder of one row: a medfaq backend, or the ONNX fp32 export run by OpenVINO (`OPENVINO_HINTS`), which,
    like every derived graph, must pass the probe-search check against the fp32 graph (index/onnx/check.py)."""
    from medfaq.common.runtime import resolve_model
    from medfaq.index.encoder import load_encoder
    from medfaq.index.onnx.encoder import OnnxEncoder
    from medfaq.index.onnx.export import ensure_export
    from medfaq.index.onnx.graph import GRAPHS, PROBE_OUTPUTS

    if backend not in OPENVINO_HINTS:
        return load_encoder(model, backend, device="cpu")
    export = ensure_export(resolve_model(model))
    encoder = OnnxEncoder(model)
    encoder.graph.session = OpenVinoSession(export / GRAPHS["fp32"], OPENVINO_HINTS[backend])
    encoder.backend = backend
    check = encoder.graph.check(np.load(export / PROBE_OUTPUTS, allow_pickle=False), backend)
    if not check.passed:
        raise MedfaqError(f"{backend} runs {model} unlike its fp32 graph ({check.describe()}); it is not compared")
    encoder.graph.check_result = check
    return encoder


def query_latency_ms(encoder: Any, questions: list[str]) -> dict[str, float]:
    """Median and 95th percentile milliseconds of encoding one question at a time (after a few warm-up calls), and
    the mean CPU milliseconds (all threads) per question, which a busy machine disturbs less."""
    for question in questions[:WARM_UP]:
        encoder.encode([question])
    times = []
    cpu = time.process_time()
    for question in questions:
        start = time.perf_counter()
        encoder.encode([question])
        times.append(1000.0 * (time.perf_counter() - start))
    cpu_ms = 1000.0 * (time.process_time() - cpu) / len(questions)
    times.sort()
    p95 = times[int(0.95 * (len(times) - 1))]
    return {"ms_per_query_p50": statistics.median(times), "ms_per_query_p95": p95, "cpu_ms_per_query": cpu_ms}


def retrieval_quality(benchmark: Any, corpus_vectors: np.ndarray, query_vectors: np.ndarray) -> dict[str, float]:
    """Recall@1 and MRR@10 of exact cosine search (the judged test queries, in percent)."""
    from medfaq.eval.retrieval import RetrievalEvaluator, exact_search_run

    ids = [row["_id"] for row in benchmark.corpus]
    run = exact_search_run([query["_id"] for query in benchmark.queries], query_vectors, ids, corpus_vectors, TOP_K)
    metrics = RetrievalEvaluator(benchmark.qrels, benchmark.ood_ids, benchmark.dev_ids)(run)
    return {"recall@1": metrics["recall@1"], "mrr@10": metrics["mrr@10"]}


def build_texts(collection: str, synonyms: str) -> tuple[list[str], int]:
    """The texts `medfaq index build COLLECTION --synonyms SYNONYMS` encodes (questions, then the expanded texts of
    FAQs that name a concept), and how many FAQs there are."""
    from medfaq.index.collections import load_collection
    from medfaq.index.concepts import concept_lexicon
    from medfaq.index.records import record_text

    records, _ = load_collection(collection)
    texts = [record_text(record, "question") for record in records]
    concepts = concept_lexicon(synonyms)
    if concepts is None:
        return texts, len(records)
    expanded = [concepts.expand(text, record.question) for text, record in zip(texts, records, strict=True)]
    return texts + [longer for longer, text in zip(expanded, texts, strict=True) if longer != text], len(records)


def compare_backends(
    model: str,
    benchmark_dir: Path | None = None,
    backends: Sequence[str] = BACKENDS,
    build: str | None = None,
    synonyms: str = "auto",
    build_sample: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """One row per backend; see the module docstring. Every backend encodes the same texts."""
    from medfaq.eval.benchmarks import Benchmark

    benchmark = Benchmark.load(benchmark_dir) if benchmark_dir else None
    sample, build_total, build_faqs = [], 0, 0
    if build:
        everything, build_faqs = build_texts(build, synonyms)
        build_total = len(everything)
        sample = random.Random(seed).sample(everything, min(build_sample, build_total))
    questions = [q["text"] for q in benchmark.queries] if benchmark else sample
    questions = questions[:LATENCY_QUERIES]
    rows: dict[str, dict[str, float]] = {}
    settings: dict[str, str] = {}
    reference: np.ndarray | None = None
    for backend in backends:
        start = time.perf_counter()
        encoder = load_for_comparison(model, backend)
        row: dict[str, float] = {"load_s": time.perf_counter() - start}
        row.update(query_latency_ms(encoder, questions))
        if benchmark:
            throughput, corpus_vectors = Throughput.measure(encoder, [doc["text"] for doc in benchmark.corpus])
            row.update(throughput.row("corpus"))
            query_vectors = encoder.encode([q["text"] for q in benchmark.queries])
            row.update(retrieval_quality(benchmark, corpus_vectors, query_vectors))
            reference = corpus_vectors if reference is None else reference
            row["min_cosine_to_first"] = float(np.einsum("ij,ij->i", corpus_vectors, reference).min())
        if sample:
            throughput, _ = Throughput.measure(encoder, sample)
            row.update(throughput.row("build"))
            row["build_minutes_wall"] = build_total / row["build_texts_per_s"] / 60
        check = getattr(encoder, "check", {})
        if "min_cosine" in check:  # a derived graph: how it agreed with its source on the probe search
            row["check_min_cosine"], row["check_kendall_tau"] = check["min_cosine"], check["kendall_tau"]
            settings[backend] = check["setting"]
        rows[backend] = row
        del encoder
    report: dict[str, Any] = {"model": model, "backends": rows, "int8_settings": settings}
    if benchmark:
        report["benchmark"] = {"name": benchmark.name, **benchmark.counts()}
    if build:
        report["build"] = {"collection": build, "synonyms": synonyms, "faqs": build_faqs, "texts": build_total}
        report["build"]["sample"] = len(sample)
    return report


COLUMNS = (
    ("load_s", "load s", "{:.1f}"),
    ("ms_per_query_p50", "ms/query", "{:.1f}"),
    ("cpu_ms_per_query", "cpu ms/query", "{:.1f}"),
    ("corpus_texts_per_s", "texts/s", "{:.0f}"),
    ("corpus_texts_per_cpu_s", "texts/cpu-s", "{:.0f}"),
    ("recall@1", "R@1", "{:.1f}"),
    ("mrr@10", "MRR@10", "{:.1f}"),
    ("min_cosine_to_first", "min cos", "{:.4f}"),
    ("check_min_cosine", "check min cos", "{:.3f}"),
    ("check_kendall_tau", "check tau", "{:.3f}"),
    ("build_texts_per_s", "build texts/s", "{:.0f}"),
    ("build_texts_per_cpu_s", "build texts/cpu-s", "{:.0f}"),
    ("build_minutes_wall", "build min", "{:.1f}"),
)


def format_table(report: dict[str, Any]) -> str:
    """The report's rows as a Markdown table (the columns it has)."""
    rows = report["backends"]
    columns = [c for c in COLUMNS if any(c[0] in row for row in rows.values())]
    lines = ["| backend | " + " | ".join(label for _, label, _ in columns) + " |"]
    lines.append("|---|" + "---:|" * len(columns))
    for backend, row in rows.items():
        cells = [fmt.format(row[key]) if key in row else "" for key, _, fmt in columns]
        lines.append(f"| {backend} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python experiments/encoder_backends.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm", help="Encoder name or directory.")
    parser.add_argument("--benchmark", type=Path, default=None, help="A `medfaq data make-benchmark` directory.")
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help=f"Comma-separated, in this order: {', '.join([*BACKENDS, *OPENVINO_HINTS])}.",
    )
    parser.add_argument("--build", default=None, help="Collection to estimate the index build of (e.g. medquad).")
    parser.add_argument("--synonyms", default="auto", help="--synonyms of that build.")
    parser.add_argument("--build-sample", type=positive_int, default=2000, help="Texts of it to time.")
    parser.add_argument("--out", type=Path, default=None, help="Also write the JSON report here.")
    args = parser.parse_args(argv)
    if args.benchmark is None and args.build is None:
        parser.error("give --benchmark DIR, --build COLLECTION or both")
    try:
        report = compare_backends(
            args.model, args.benchmark, args.backends.split(","), args.build, args.synonyms, args.build_sample
        )
    except MedfaqError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_table(report), file=sys.stderr)
    print_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
