"""Variants of the set-up's retrieval recipe (``medfaq train biencoder --task faq --preset quick --init mpnet``)
scored on the real FAQ banks: each variant is trained, gets its own MedQuAD index, and is evaluated on the test
questions of covid-q, quebec and medquad-rqe (all and the clean ones) and on their development parts, the parts a
recipe is chosen on (paired question by question with another variant there too). Produced "Training that fits two
cores" of docs/experiments/setup.md and "Training on the banks' own FAQs" and "Every encoder on the three
development parts" of docs/experiments/biencoder.md:

    python experiments/recipe_variants.py run half -- --max-pairs 6559
    python experiments/recipe_variants.py run real -- --sources rqe,quebec,mqp
    python experiments/recipe_variants.py run shipped --model $MEDFAQ_HOME/models/biencoder-mpnet-faq-quick
    python experiments/recipe_variants.py table shipped half real --against shipped

Each variant lives in OUT/NAME (default OUT: /tmp/recipe-variants): model/, medquad/ (its MedQuAD index), bench/,
runs/ (TREC runs of the test questions), dev-runs/ (of every question, the development ones listed), test-BANK.json
and dev-BANK.json (`medfaq eval retrieval --json`); a step whose output exists is skipped, so an interrupted run
resumes. The clean question ids come from `medfaq data audit --clean-ids DIR`.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from medfaq.common.ranking import read_trec_run
from medfaq.eval.benchmarks import Benchmark
from medfaq.retriever.decisions.stage_choice import sign_test

BANKS = ("covid-q", "quebec", "medquad-rqe")  # each halved into development and test questions
RECIPE = ("train", "biencoder", "--task", "faq", "--preset", "quick", "--init", "mpnet")


def medfaq(*args: str, log: Path) -> float:
    """Run one medfaq command, its standard output into `log` and its errors beside it (``.err``); its wall
    seconds."""
    start = time.perf_counter()
    with log.open("w") as out, log.with_suffix(".err").open("w") as err:
        subprocess.run(["medfaq", *args], stdout=out, stderr=err, check=True)
    return time.perf_counter() - start


def run(name: str, out: Path, data: str, clean: Path, model: str | None, train_args: list[str]) -> None:
    """Train (unless `model` is given), index MedQuAD, make the benchmarks and evaluate one variant."""
    home = out / name
    home.mkdir(parents=True, exist_ok=True)
    walls = json.loads((home / "walls.json").read_text()) if (home / "walls.json").is_file() else {}
    encoder = model or str(home / "model")
    if model is None and not (home / "model" / "threshold.json").is_file():
        walls["train"] = medfaq(*RECIPE, "--out", encoder, "--force", *train_args, log=home / "train.log")
    if not (home / "medquad" / "manifest.json").is_file():
        walls["index"] = medfaq(
            "index", "build", "medquad", "--encoder", encoder, "--synonyms", "none", "--out", str(home / "medquad"),
            log=home / "index.log",
        )  # fmt: skip
    (home / "walls.json").write_text(json.dumps(walls, indent=2))
    for bank in BANKS:
        target = home / "bench" / bank
        if not (target / "benchmark.json").is_file():
            source = ["--bank", str(home / "medquad")] if bank == "medquad-rqe" else ["--encoder", encoder]
            medfaq(
                "data", "make-benchmark", bank, "--out", str(target), "--from", data, *source, "--synonyms", "none",
                log=home / f"bench-{bank}.log",
            )  # fmt: skip
    (home / "runs").mkdir(exist_ok=True)
    for bank in BANKS:
        if reported(home / f"test-{bank}.json"):
            continue
        medfaq(
            "eval", "retrieval", "--benchmark", str(home / "bench" / bank), "--mode", "dense", "--json",
            "--query-ids", str(clean / f"{bank}.txt"), "--run-out", str(home / "runs" / f"{bank}.trec"),
            log=home / f"test-{bank}.json",
        )  # fmt: skip
    dev_ids = home / "dev-ids"
    dev_ids.mkdir(exist_ok=True)
    (home / "dev-runs").mkdir(exist_ok=True)
    for bank in BANKS:  # the same benchmark with its development questions counted as judged ones, and listed
        if reported(home / f"dev-{bank}.json"):
            continue
        source, target = home / "bench" / bank, home / "dev" / bank
        target.mkdir(parents=True, exist_ok=True)
        for entry in ("benchmark.json", "corpus.jsonl", "qrels.tsv", "index"):
            if not (target / entry).exists():
                (target / entry).symlink_to(source / entry)
        benchmark = Benchmark.load(source)
        queries = [{**query, "metadata": {**query.get("metadata", {}), "split": "all"}} for query in benchmark.queries]
        (target / "queries.jsonl").write_text("".join(json.dumps(query) + "\n" for query in queries))
        (dev_ids / f"{bank}.txt").write_text("".join(f"{qid}\n" for qid in sorted(benchmark.dev_ids)))
        medfaq(
            "eval", "retrieval", "--benchmark", str(target), "--mode", "dense", "--json",
            "--query-ids", str(dev_ids / f"{bank}.txt"), "--run-out", str(home / "dev-runs" / f"{bank}.trec"),
            log=home / f"dev-{bank}.json",
        )  # fmt: skip


def reported(path: Path) -> bool:
    """Whether an evaluation's output is there already (an interrupted one leaves it empty)."""
    return path.is_file() and "{" in path.read_text()


def scores(path: Path) -> dict[str, dict[str, float]]:
    """Per benchmark: R@1 and MRR@10 of all judged questions and R@1 of the listed ones, from `--json` output."""
    text = path.read_text()
    report = json.loads(text[text.index("{") :])
    found = {}
    for benchmark in report["benchmarks"]:
        row = benchmark["rows"][0]
        found[benchmark["benchmark"]] = {
            "r1": row["recall@1"],
            "mrr": row["mrr@10"],
            "listed_r1": row.get("listed", {}).get("recall@1", float("nan")),
        }
    return found


def first_hits(path: Path) -> dict[str, str]:
    return {qid: max(ranked, key=ranked.get) for qid, ranked in read_trec_run(str(path)).items() if ranked}


def paired(mine: Path, theirs: Path, judged: dict[str, dict[str, int]]) -> tuple[int, int]:
    """Judged questions run `mine` answers at rank 1 where run `theirs` does not, and the other way."""
    first, other = first_hits(mine), first_hits(theirs)
    won = sum(first.get(q) in golds and other.get(q) not in golds for q, golds in judged.items())
    lost = sum(other.get(q) in golds and first.get(q) not in golds for q, golds in judged.items())
    return won, lost


def steps(home: Path) -> str:
    """The steps the variant trained, from its training log's progress bar (which counts on past its total when
    distinct texts add batches)."""
    counted = []
    for log in (home / "train.err", home / "train.log"):  # the driver's log, or a shell run's with both streams
        if log.is_file():
            text = log.read_text()
            counted += re.findall(r"bi-encoder[^\r\n]*?\| *(\d+)/\d+ \[", text)
            counted += re.findall(r"bi-encoder \(\w+\): (\d+)step \[", text)
    return str(max(map(int, counted))) if counted else "-"


def table(names: list[str], out: Path, against: str | None) -> None:
    header = "| variant | steps | train min | " + " | ".join(f"{b} R@1 / MRR@10 (clean R@1)" for b in BANKS)
    header += " | " + " | ".join(f"dev {b} R@1" for b in BANKS) + " | mean dev R@1 |"
    print(header + "\n|" + "---|" * (4 + 2 * len(BANKS)))
    benchmarks = {bank: Benchmark.load(out / (against or names[0]) / "bench" / bank) for bank in BANKS}
    parts = [  # in the cells' order: (runs directory, bank, its judged questions), the test halves, then the dev ones
        (runs, bank, {q: golds for q, golds in b.qrels.items() if (q in b.dev_ids) == (runs == "dev-runs")})
        for runs in ("runs", "dev-runs")
        for bank, b in benchmarks.items()
    ]
    for name in names:
        home = out / name
        test = {bank: scores(home / f"test-{bank}.json")[bank] for bank in BANKS}
        dev = {bank: scores(home / f"dev-{bank}.json")[bank]["listed_r1"] for bank in BANKS}
        walls = json.loads((home / "walls.json").read_text()) if (home / "walls.json").is_file() else {}
        cells = [f"{test[b]['r1']:.1f} / {test[b]['mrr']:.1f} ({test[b]['listed_r1']:.1f})" for b in BANKS]
        cells += [f"{dev[b]:.1f}" for b in BANKS]
        if against and name != against:
            for number, (runs, bank, judged) in enumerate(parts):
                won, lost = paired(home / runs / f"{bank}.trec", out / against / runs / f"{bank}.trec", judged)
                cells[number] += f" +{won} -{lost} p {sign_test(won, lost):.2g}"
        cells.append(f"{sum(dev.values()) / len(dev):.1f}")
        train = f"{walls['train'] / 60:.1f}" if "train" in walls else "-"
        print(f"| {name} | {steps(home)} | {train} | " + " | ".join(cells) + " |")
    if against:
        print(f"\n+W -L p: questions right at rank 1 where {against} is wrong, the other way, one-sided sign test")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/recipe-variants"))
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="Train, index and evaluate one variant.")
    run_parser.add_argument("name")
    run_parser.add_argument("--model", help="Evaluate this trained model instead of training one.")
    run_parser.add_argument("--data", default="../shared/data")
    run_parser.add_argument("--clean", type=Path, default=Path("bench/clean"), help="`medfaq data audit --clean-ids`")
    table_parser = commands.add_parser("table", help="The variants' scores side by side.")
    table_parser.add_argument("names", nargs="+")
    table_parser.add_argument("--against", help="The variant the others are paired with, question by question.")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)  # after --: options added to the recipe's command
    args = parser.parse_args(argv[:cut])
    if args.command == "run":
        run(args.name, args.out, args.data, args.clean, args.model, argv[cut + 1 :])
    else:
        table(args.names, args.out, args.against)


if __name__ == "__main__":
    main()
