"""`medfaq data dedup` and `medfaq eval summarizer`: summarization data checks and metrics."""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

import typer

from medfaq.app.cmd_summarize import GUIDANCE, LENGTH_PENALTY, MBR
from medfaq.common.runtime import MedfaqError, resolve_model


def dedup(
    datasets: list[str] = typer.Argument(..., help="Datasets (meqsum, chq_summ, healthcaremagic, mediqa2021, rqe)."),
    data_root: Path | None = typer.Option(None, "--data-root", help="Read data laid out like ../shared/data."),
    key_field: str = typer.Option("chq", "--field", help="Duplicate key: chq (as ECL) or pair (chq and faq)."),
    examples: int = typer.Option(3, "--examples", min=0, help="Example groups shown per level."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
    do_resplit: bool = typer.Option(False, "--resplit", help="Write a de-duplicated 8:1:1 re-split to --out."),
    out: Path | None = typer.Option(None, "--out", help="Directory for --resplit (shared/data layout)."),
    seed: int = typer.Option(0, "--seed", help="Shuffle seed of the re-split."),
    level: str = typer.Option("normalised", "--level", help="What --resplit drops: exact|normalised|contained."),
) -> None:
    """Find exact, normalised and near-duplicate samples within and across splits and datasets; optionally re-split."""
    from medfaq.eval.summarization_dedup import LEVELS, collect_samples, find_duplicates, resplit

    if do_resplit and out is None:
        raise MedfaqError("--resplit needs --out DIR")
    if level not in LEVELS:
        raise MedfaqError(f"unknown --level {level!r}; choose {', '.join(LEVELS)}")
    samples = collect_samples(datasets, data_root)
    report = find_duplicates(samples, key_field, n_examples=examples)
    payload = report.to_dict()
    if do_resplit:
        payload["resplit"] = resplit(samples, out, seed, key_field, level)
    if as_json:
        typer.echo(json.dumps(payload, ensure_ascii=False))
        return
    typer.echo(report.format())
    for dataset, counts in payload.get("resplit", {}).items():
        split_counts = ", ".join(f"{split} {count}" for split, count in counts.items())
        typer.echo(f"re-split {dataset} ({level} duplicates dropped, seed {seed}): {split_counts} in {out}")


def eval_summarizer(
    model: str = typer.Option(..., "--model", help="Trained summarizer directory, model name or HF id."),
    data: str = typer.Option("meqsum:test", "--data", help="<dataset>:<split>, e.g. meqsum:test."),
    as_json: bool = typer.Option(False, "--json", help="Print only one JSON object of the metrics on stdout."),
    output: Path | None = typer.Option(
        None, "--output", help="Predictions JSONL (default predictions_<data>.jsonl; - = stdout, metrics on stderr)."
    ),
    num_beams: int = typer.Option(3, "--num-beams", min=1, help="Beam size (1: greedy)."),
    max_length: int = typer.Option(64, "--max-length", min=1, help="Maximum generated tokens."),
    batch_size: int = typer.Option(16, "--batch-size", min=1, help="Generation batch size."),
    mbr: int = MBR,
    guidance: float = GUIDANCE,
    length_penalty: float = LENGTH_PENALTY,
    data_root: Path | None = typer.Option(None, "--data-root", help="Read data laid out like ../shared/data."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Evaluate the first N pairs only."),
    ner: str = typer.Option("auto", "--ner", help="Entity recogniser for FIR/consistency: auto|dictionary|stanza."),
    device: str | None = typer.Option(None, "--device", help="cpu or cuda (default: cuda when visible)."),
    quantize: bool = typer.Option(False, "--quantize", help="int8 dynamic quantisation of the summarizer (CPU)."),
    int8_backend: str = typer.Option(
        "auto", "--int8-backend", help="With --quantize: auto, ctranslate2 (decoder-only models) or torch."
    ),
) -> None:
    """Generate summaries for a summarization split and report ROUGE-1/2/L, FIR and entity consistency (percent)."""
    from medfaq.eval.summarization import SummarizationEvaluator
    from medfaq.eval.summarization_data import load_pairs
    from medfaq.retriever.runs import check_output, is_stdio, write_text_atomic
    from medfaq.summarizer.decoding import Decoding
    from medfaq.summarizer.entities import load_recognizer
    from medfaq.summarizer.generation import consensus

    output = output or Path(f"predictions_{re.sub(r'[^A-Za-z0-9_.-]+', '_', data)}.jsonl")
    check_output(output)
    pairs = load_pairs(data, data_root)[:limit]
    if not pairs:
        raise MedfaqError(f"{data} has no pairs")
    if guidance and quantize:
        raise MedfaqError("--guidance runs on the fp32 model; drop --quantize")
    decoding = Decoding(num_beams, max_length, length_penalty, guidance, mbr)
    resolve_model(model)  # a missing model fails here, before anything is loaded
    summarizer = _summarizer_class().load(model, device=device, quantize=quantize, int8_backend=int8_backend)
    evaluator = SummarizationEvaluator.from_pairs(
        pairs, recognizer=load_recognizer(ner), name=f"{model} on {data}", stream=sys.stderr if as_json else None
    )
    start = time.perf_counter()
    texts = [pair.chq for pair in pairs]
    found = summarizer.candidates(texts, decoding, batch_size)
    predictions = [consensus(beams) for beams in found]
    seconds = time.perf_counter() - start
    rows = [
        json.dumps(
            {"id": p.id, "chq": p.chq, "reference": p.faq, "prediction": prediction}
            | ({"candidates": beams} if mbr > 1 else {}),
            ensure_ascii=False,
        )
        + "\n"
        for p, prediction, beams in zip(pairs, predictions, found, strict=True)
    ]
    to_stdout = is_stdio(output)
    if to_stdout:
        sys.stdout.writelines(rows)
    else:
        write_text_atomic(output, rows)
    metrics = evaluator(predictions)
    metrics |= {"seconds": seconds, "questions_per_s": len(pairs) / seconds if seconds else 0.0}
    where = "stdout" if to_stdout else str(output)
    if as_json:
        settings = {"model": model, "data": data, "decoding": asdict(decoding), "predictions": where}
        typer.echo(json.dumps(metrics | settings), err=to_stdout)
    else:
        typer.echo(f"{metrics['questions_per_s']:.1f} questions/s; predictions in {where}", err=to_stdout)


def _summarizer_class():
    """`summarizer.generation.Summarizer` (imported late: loading torch and transformers takes seconds)."""
    from medfaq.summarizer.generation import Summarizer

    return Summarizer


def register(app: typer.Typer, *, data_app: typer.Typer, train_app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add this module's commands to the `medfaq` command groups."""
    data_app.command("dedup")(dedup)
    eval_app.command("summarizer")(eval_summarizer)
