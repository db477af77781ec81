"""`medfaq data fetch|list|dedup|make-benchmark|split-benchmark|audit`: datasets, their duplicates, retrieval
benchmarks and their contamination by training data."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from medfaq.app.cmd_index import inherit_threshold, open_encoder
from medfaq.app.options import ENCODER_OPTION, SYNONYMS_OPTION
from medfaq.common.runtime import MedfaqError, indexes_dir
from medfaq.eval.contamination import NEAR
from medfaq.index.datasets import BENCHMARKS, SUMMARIZATION_DATASETS


def fetch(
    name: str = typer.Argument(..., help="Dataset name (see `medfaq data list`)."),
    from_dir: Path | None = typer.Option(
        None, "--from", help="Copy from a local folder with the shared/data layout instead of downloading."
    ),
    force: bool = typer.Option(False, "--force", help="Fetch again even when the files are present."),
) -> None:
    """Download a public dataset from its original source (or copy it with --from) into the data directory."""
    from medfaq.index.datasets import DATASETS, fetch_dataset

    target = fetch_dataset(name, from_dir, force=force)
    typer.echo(f"{name}: {', '.join(DATASETS[name].files)} in {target}")


def list_datasets() -> None:
    """List the datasets `medfaq data fetch` knows, with their licenses and whether they are fetched."""
    from medfaq.index.datasets import DATASETS, dataset_dir, is_fetched

    for spec in DATASETS.values():
        state = f"fetched in {dataset_dir(spec.name)}" if is_fetched(spec.name) else "not fetched"
        typer.echo(f"{spec.name:<10} {spec.description}\n{'':<10} license: {spec.license}\n{'':<10} {state}")


def dedup(
    datasets: list[str] = typer.Argument(..., help=f"Datasets ({', '.join(SUMMARIZATION_DATASETS)})."),
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


def split_benchmark(
    benchmark: Path = typer.Argument(..., help="A benchmark directory (`medfaq data make-benchmark`)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the split."),
    fractions: str = typer.Option("0.6,0.2,0.2", "--fractions", help="Shares of train,dev,test."),
    out: Path | None = typer.Option(None, "--out", help="Directory for the parts (default: BENCHMARK/split-SEED)."),
) -> None:
    """Split a benchmark's judged questions into seeded train / dev / test parts, each with its queries, qrels and
    training pairs (question -> its gold FAQ question), to train and choose a stage for that bank."""
    from medfaq.eval.benchmarks import Benchmark, save_query_parts

    try:
        shares = tuple(float(value) for value in fractions.split(","))
    except ValueError:
        raise MedfaqError(f"--fractions takes three numbers such as 0.6,0.2,0.2, got {fractions!r}") from None
    out = out or benchmark / f"split-{seed}"
    counts = save_query_parts(Benchmark.load(benchmark), out, seed, shares)
    typer.echo(f"{', '.join(f'{part} {count}' for part, count in counts.items())} judged questions -> {out}")


def make_benchmark(
    name: str = typer.Argument(..., help=" | ".join(BENCHMARKS)),
    out: Path = typer.Option(..., "--out", help="Directory for corpus.jsonl, queries.jsonl, qrels.tsv, ..."),
    data_from: Path | None = typer.Option(
        None, "--from", help="Read the datasets from DIR (the shared/data layout) instead of `medfaq data fetch`."
    ),
    build_index: bool = typer.Option(True, "--index/--no-index", help="Also index the corpus into OUT/index."),
    encoder: str = ENCODER_OPTION,
    bank: Path | None = typer.Option(
        None,
        "--bank",
        help="medquad-chq, medquad-rqe: the MedQuAD index whose copy indexes the corpus (medquad-chq: its records are "
        "the bank; default: indexes/medquad-minilm).",
    ),
    synonyms: str = SYNONYMS_OPTION,
) -> None:
    """Write a retrieval benchmark in the BEIR layout (plus TREC qrels, ood.txt, dev.txt) and index its corpus."""
    from medfaq.eval.benchmarks import BANK_INDEX, CORPUS_FIELDS, OVER_BANK, index_over_bank
    from medfaq.eval.benchmarks import make_benchmark as build
    from medfaq.index.collections import load_collection, read_records
    from medfaq.index.concepts import concept_lexicon
    from medfaq.index.faq_index import FaqIndex
    from medfaq.index.storage import RECORDS, check_index_target, is_index

    if build_index:
        check_index_target(out / "index")
    over_bank = name in OVER_BANK
    concepts = concept_lexicon(synonyms) if build_index and not over_bank else None
    bank = bank or indexes_dir() / BANK_INDEX
    needs_bank = name == "medquad-chq" or (build_index and over_bank)
    if needs_bank and not is_index(bank):
        raise MedfaqError(f"no MedQuAD index at {bank}; build it with `medfaq index build medquad --out {bank}`")
    benchmark = build(name, data_from, read_records(bank / RECORDS) if name == "medquad-chq" else None)
    benchmark.save(out)
    counts = ", ".join(f"{value} {key.replace('_', ' ')}" for key, value in benchmark.counts().items())
    typer.echo(f"{name}: {counts} -> {out}")
    if build_index and over_bank:
        encoded = index_over_bank(benchmark, out / "index", bank, additions=name == "medquad-chq")
        typer.echo(f"copied the index {bank} and added {encoded} FAQs into {out / 'index'}")
    elif build_index:
        records, _ = load_collection(out / "corpus.jsonl", "jsonl", CORPUS_FIELDS)
        sentence_encoder = open_encoder(encoder)
        FaqIndex.build(records, sentence_encoder, concepts=concepts).save(out / "index")
        inherit_threshold(out / "index", sentence_encoder.name)
        typer.echo(f"indexed {len(records)} FAQs into {out / 'index'}")


def audit(
    names: list[str] | None = typer.Argument(
        None, help=f"Benchmarks to audit (default: all; {', '.join(BENCHMARKS)})."
    ),
    data_from: Path | None = typer.Option(
        None, "--from", help="Read the datasets from DIR (the shared/data layout) instead of `medfaq data fetch`."
    ),
    sources: str | None = typer.Option(
        None, "--sources", help="Only these training sources, comma-separated (default: all, e.g. meqsum:train)."
    ),
    near: float = typer.Option(
        NEAR, "--near", min=0.0, max=1.0, help="Jaccard similarity of character 5-grams that makes a near-duplicate."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the audit as one JSON object, every overlap with it."),
    clean_ids: Path | None = typer.Option(
        None, "--clean-ids", help="Write DIR/<benchmark>.txt: the ids of its questions no training source holds."
    ),
) -> None:
    """Find the benchmarks' dev and test questions that a training source holds, exactly (normalised text) or as a
    near-duplicate; real FAQ banks first. `medfaq eval retrieval --query-ids DIR/<benchmark>.txt` scores the others."""
    from medfaq.eval.contamination import SHINGLE, audit_benchmarks, format_audit, write_clean_ids

    wanted = [source.strip() for source in sources.split(",")] if sources else None
    audits = audit_benchmarks(names, data_from, near, wanted)
    written = write_clean_ids(audits, clean_ids) if clean_ids is not None else {}
    if as_json:
        payload = {"near": near, "shingle": SHINGLE, "benchmarks": [bench.to_dict() for bench in audits]}
        typer.echo(json.dumps(payload | {"clean_ids": {k: str(v) for k, v in written.items()}}, ensure_ascii=False))
        return
    typer.echo(format_audit(audits), nl=False)
    if written:
        typer.echo(f"clean question ids: {', '.join(str(path) for path in written.values())}")
