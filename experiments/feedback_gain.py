"""What training on the experts' links teaches the bi-encoder: before/after on a held-back slice of the links.

COVID-Q (`medfaq data fetch covid_q`) holds 1,611 real COVID-19 questions in 575 classes, each class one question
asked several ways; none of it is a training source. ``prepare`` plays a help desk that meets those questions:

* its FAQ bank is one FAQ per class, the class's first question (575 FAQs);
* every other question of a class reaches the experts' queue (retriever/queue/question_queue.py), as an abstained
  question does, and is grouped there by the index's bi-encoder;
* a simulated expert then works the queue as a person would from the queue page: splits each group by class,
  merges the groups of one class, and links each group to its class's FAQ (its questions become the FAQ's
  phrasings in the index).

``medfaq train biencoder --task faq --feedback --feedback-index DIR/index`` then trains on the links outside the
held-back fifth of the groups (:func:`medfaq.retriever.training.pair_data.expert_links`). ``score`` searches each
model's encoding of the FAQ questions alone (the index as it was before any link, so a held-back question is never found
by its own wording) with the held-back questions, and with the linked questions trained on, and prints R@1, R@5,
MRR@10 and nDCG@10 for each model.

    python experiments/feedback_gain.py prepare --out DIR [--encoder auto] [--data ../shared/data]
    medfaq train biencoder --task faq --preset quick --seed 0 --feedback --feedback-index DIR/index --out MODEL
    python experiments/feedback_gain.py score --index DIR/index --model before=auto --model after=MODEL [--json F]

Results: docs/experiments/abstention-and-queue.md, "The experts' queue (issue 45): grouping quality and the time to
add a question", its "Learning from the links: `--feedback` training, before and after, on a held-back slice".
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from medfaq.common.runtime import MedfaqError
from medfaq.eval.benchmarks import covid_q_classes
from medfaq.eval.benchmarks import covid_q_faq_id as faq_id
from medfaq.eval.script_args import print_report
from medfaq.index.records import FaqRecord

EXPERT = "simulated expert"
SCORED_DEPTH = 10


def work_the_queue(queue: Any, class_of: dict[str, str]) -> dict[str, int]:
    """Split every waiting group by class, merge the groups of one class, link each to its class's FAQ."""
    splits = merges = 0
    for group in queue.groups():
        parts: dict[str, list[int]] = defaultdict(list)
        for question in group.questions:
            parts[class_of[question.text]].append(question.id)
        for ids in sorted(parts.values(), key=len)[:-1]:  # the largest part stays
            queue.split(group.id, ids)
            splits += 1
    by_class: dict[str, list[int]] = defaultdict(list)
    for group in queue.groups():
        by_class[class_of[group.questions[0].text]].append(group.id)
    for group_ids in by_class.values():
        if len(group_ids) > 1:
            queue.merge(group_ids)
            merges += 1
    linked = 0
    for group in queue.groups():
        queue.link(group.id, faq_id(class_of[group.questions[0].text]), by=EXPERT)
        linked += 1
    return {"splits": splits, "merges": merges, "groups_linked": linked}


def prepare(out: Path, encoder_name: str, data_root: Path | None) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from medfaq.index.encoder import load_encoder
    from medfaq.index.faq_index import FaqIndex
    from medfaq.retriever.pipeline import PipelineConfig
    from medfaq.retriever.pipeline_file import write_config
    from medfaq.retriever.queue.question_queue import QuestionQueue, queue_beside
    from medfaq.retriever.trained_models import choose_encoder

    if out.exists() and any(out.iterdir()):
        raise MedfaqError(f"{out} is not empty: prepare writes a new index and queue there")
    classes = covid_q_classes(data_root)
    encoder = load_encoder(choose_encoder(encoder_name))
    records = [FaqRecord(id=faq_id(c), question=texts[0], source="covid_q") for c, texts in classes.items()]
    index_dir, log = out / "index", out / "queue" / "unanswered.jsonl"  # an index save replaces its directory
    FaqIndex.build(records, encoder).save(index_dir)
    write_config(index_dir, PipelineConfig(unanswered_log=str(log)))
    queue = QuestionQueue(queue_beside(log), encoder, index_dir=index_dir)
    faq_texts = {record.question for record in records}
    class_of = {text: c for c, texts in classes.items() for text in texts[1:] if text not in faq_texts}
    for text in tqdm(class_of, desc="queueing", unit="question"):
        queue.add(text)
    groups_formed = len(queue.groups())
    work = work_the_queue(queue, class_of)
    return {
        "index": str(index_dir),
        "encoder": encoder.name,
        "faqs": len(records),
        "queued_questions": len(class_of),
        "classes_queued": len(set(class_of.values())),
        "groups_formed": groups_formed,
        **work,
    }


def score(index_dir: Path, models: dict[str, str], seed: int) -> dict[str, Any]:
    from medfaq.common.ranking import ranking_metrics
    from medfaq.index.encoder import load_encoder
    from medfaq.index.faq_index import FaqIndex
    from medfaq.retriever.trained_models import choose_encoder
    from medfaq.retriever.training.pair_data import expert_links

    records = FaqIndex.load(index_dir).records()
    slices = {
        "held back": expert_links(index_dir, seed, held_back=True),
        "trained on": expert_links(index_dir, seed, held_back=False),
    }
    if not slices["held back"]:
        raise MedfaqError(f"{index_dir} has no held-back expert links: run `prepare` first")
    report: dict[str, Any] = {
        "index": str(index_dir),
        "faqs": len(records),
        "seed": seed,
        "questions": {name: len(links) for name, links in slices.items()},
        "faqs_linked": {name: len(Counter(faq for _, faq in links)) for name, links in slices.items()},
        "models": {},
    }
    for label, name in models.items():
        bank = FaqIndex.build(records, load_encoder(choose_encoder(name)), progress=False)
        report["models"][label] = {"model": bank.encoder.name}
        for slice_name, links in slices.items():
            queries = [question for question, _ in links]
            hits = bank.search_dense(queries, SCORED_DEPTH)
            run = {str(i): {faq: float(score) for faq, score in row} for i, row in enumerate(hits)}
            qrels = {str(i): {faq: 1} for i, (_, faq) in enumerate(links)}
            report["models"][label][slice_name] = ranking_metrics(run, qrels)[0]
    return report


def print_table(report: dict[str, Any]) -> None:
    print("| model | questions | R@1 | R@5 | MRR@10 | nDCG@10 |")
    print("|---|---|---:|---:|---:|---:|")
    for label, result in report["models"].items():
        for slice_name in report["questions"]:
            metrics = result[slice_name]
            cells = " | ".join(f"{metrics[m]:.1f}" for m in ("recall@1", "recall@5", "mrr@10", "ndcg@10"))
            print(f"| {label} | {slice_name} ({report['questions'][slice_name]}) | {cells} |")


def model_option(value: str) -> tuple[str, str]:
    label, sep, name = value.partition("=")
    if not sep or not label or not name:
        raise argparse.ArgumentTypeError(f"expected LABEL=MODEL, got {value!r}")
    return label, name


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python experiments/feedback_gain.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("prepare", help="index, queue and expert links from COVID-Q")
    made.add_argument(
        "--out", type=Path, required=True, help="a new directory for the index (DIR/index) and its queue (DIR/queue)"
    )
    made.add_argument("--encoder", default="auto", help="the index's bi-encoder (auto: the set-up one, else minilm)")
    made.add_argument("--data", type=Path, default=None, help="data laid out as ../shared/data (default: fetched)")
    scored = commands.add_parser("score", help="before/after on the held-back links")
    scored.add_argument("--index", type=Path, required=True, help="the index `prepare` wrote")
    scored.add_argument("--model", type=model_option, action="append", required=True, help="LABEL=MODEL, repeated")
    scored.add_argument("--seed", type=int, default=0, help="the training's --seed (it picks the held-back groups)")
    for command in (made, scored):
        command.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            report = prepare(args.out.expanduser(), args.encoder, args.data)
        else:
            report = score(args.index.expanduser(), dict(args.model), args.seed)
    except MedfaqError as error:
        sys.exit(f"error: {error}")
    print_report(report, args.json)
    if args.command == "score":
        print_table(report)


if __name__ == "__main__":
    main()
