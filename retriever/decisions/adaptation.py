"""`medfaq index adapt`: an index learns its own bank from questions written for each of its FAQs.

For every FAQ the question writer (summarizer/question_writer.py) samples K consumer questions. One question of each
of up to `dev_faqs` FAQs is held back as the bank's development query (never a phrasing, never trained on); the rest
pass the round trip: kept only where the index's own pipeline ranks their FAQ in its top `round_trip_depth`. Then
each part is tried in `PARTS` order and kept by the rule below:

- ``answers``: the head of each FAQ's answer, and its question followed by that head, as two more rows of that FAQ
  (phrasings marked ``adapt:answer``);
- ``phrasings``: the kept questions as the FAQ's phrasings (marked ``adapt:question``);
- ``encoder``: the index's bi-encoder continued on (kept question, its FAQ, a near miss from the same bank), labelled
  by the reranker's margins (GPL's margin-MSE) or, without a reranker or with ``encoder_labels="hard"``, hard labels
  (retriever/biencoder/adapted.py); saved beside the index (`work_dir`) and the bank encoded again with it.

The rule, fixed before any bank was scored: a part is kept when, added to the parts kept before it, it does not lower
R@1 on the development queries (the held-back generated questions, and the user's labelled queries when given: on
each set separately), and it raises R@1 or MRR@10 on at least one of them. Added after the first measurements
(docs/results.md, "Generated questions alone keep only the answer rows"): the parts learned from the generated
questions (:data:`LEARNED_PARTS`) must raise R@1 or MRR@10 on the user's labelled queries; without labelled queries
they are not tried. Held-back generated questions had kept them on three banks where the bank's real questions then
lost, as they had turned on the likelihood stage (retriever/decisions/stage_choice.py). Added after a sample of MedQuAD
(docs/results.md, "Answer rows on a sample of MedQuAD"): a part that adds rows to some FAQs only is also judged on the
held-back questions of the FAQs it gives no row (:data:`WITHOUT_ROWS`), which the rows can only push down; there the
answer rows had gained on all held-back questions together while losing on those, and the bank's real questions,
nearly all about FAQs without answers, lost. The decision and every number it was made with are recorded in the
manifest (`IndexManifest.adaptation`); the index's files from before are kept beside it, and `undo` puts them back
(or, where the index was saved since, removes every adapted row and the record).

Generated questions are cached beside the index (`work_dir`), one JSON line per FAQ as they are written, so an
interrupted run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from medfaq.common.ranking import first_hits
from medfaq.common.runtime import MedfaqError, resolve_model, utc_timestamp
from medfaq.index.faq_index import FaqIndex
from medfaq.index.lock import write_lock
from medfaq.index.records import FaqRecord
from medfaq.index.storage import MANIFEST, disk_version, is_index, read_manifest
from medfaq.retriever.decisions.adaptation_config import PARTS, AdaptConfig

ORIGIN_PREFIX = "adapt:"
ORIGINS = {"answers": "adapt:answer", "phrasings": "adapt:question"}
LEARNED_PARTS = ("phrasings", "encoder")  # learned from the generated questions: judged by labelled queries only
NEEDS_LABELS = "needs labelled development queries (--dev-queries/--dev-qrels); generated ones alone never keep it"
ADAPTED_BY = "medfaq index adapt"
DEV_DEPTH = 10  # MRR@10
DEVELOPMENT_FILE = (
    "development.jsonl"  # in the work directory: the held-back questions, with the FAQ each was written for
)
TRAINING_FILE = "training.jsonl"  # in the work directory: the questions that passed the round trip, as summary pairs
SAMPLE_FAQS = 8  # FAQs whose questions a dry run writes to time the writer
SAMPLE_ROWS = 32  # rows a dry run encodes to time the encoding of the answer rows
ENCODING_SUFFIX = ".encoding"  # a part's rows encoded so far (`rows_staging`), removed when `adapt` ends
WITHOUT_ROWS = "generated-without-rows"  # development set: held-back questions of the FAQs a part adds no row to
BEFORE_DIR = "before"  # in the work directory: the index's files as they were before the adaptation (`keep_before`)
BEFORE_VERSION_FILE = "before.version"  # in the work directory: the index's version the adaptation saved


class NothingToAdapt(MedfaqError):
    """No part of the adaptation can be tried on this bank with what was given."""


@dataclass(frozen=True)
class DevQuery:
    text: str
    golds: frozenset[str]


def work_dir(directory: Path) -> Path:
    """Where an index's generated questions are cached: beside the index, never inside it (a save replaces it)."""
    directory = Path(directory).expanduser().resolve()
    return directory.parent / f".{directory.name}.adapt"


def writer_location(name: str) -> str:
    """The question writer's directory; a missing one (or a directory that is no trained model, or whose training
    stopped before its end) is a one-line error saying how to make it."""
    from medfaq.common.model_kinds import QUESTION_WRITER
    from medfaq.retriever.trained_models import require_trained
    from medfaq.summarizer.modeling import TRAIN_CONFIG_FILE, trained_summarizer

    require_trained(name, "question writer")
    try:
        location = resolve_model(name)
    except MedfaqError:
        location = ""
    if not location or not (Path(location) / TRAIN_CONFIG_FILE).is_file():
        raise MedfaqError(
            f"no question writer {name!r}: run `medfaq setup`, or train one with `medfaq train question-writer --out "
            "DIR` and pass --writer DIR"
        )
    trained_summarizer(location, QUESTION_WRITER)  # another kind of model, or a run stopped before its end
    return location


def generation_key(config: AdaptConfig, writer: Any = None) -> str:
    """What the generated questions depend on: the writer's weights (`writer`: a loaded one, else
    `config.writer`), the seed and the sampling. Not K: one cache serves every K up to the largest written (the
    first K of an FAQ's samples, each an independent draw; an FAQ with fewer than K is written again, and its K
    differ from the fewer, since the draws of one batch depend on how many are drawn)."""
    location = getattr(writer, "path", None) if writer is not None else writer_location(config.writer)
    if location is None:
        identity: Any = type(writer).__name__
    else:
        files = Path(location).glob("*.safetensors")
        identity = [str(location), sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)]
    spec = [identity, config.writer_int8, config.seed, config.top_p]
    return hashlib.sha256(json.dumps(spec).encode()).hexdigest()[:16]


def faq_input(record: FaqRecord) -> tuple[str, str]:
    return record.question, record.answer


def generated_questions(
    records: Sequence[FaqRecord],
    config: AdaptConfig,
    cache: Path,
    writer: Any = None,
    progress: bool = True,
) -> dict[str, list[str]]:
    """Each FAQ's first K samples (blank ones as ""), written for those with fewer in `cache` (appended as they are
    written, so a run stopped anywhere resumes there); `writer`: a loaded :class:`QuestionWriter` (else
    `config.writer`)."""
    from tqdm.auto import tqdm

    k = config.questions_per_faq
    done = read_generated(cache)
    todo = [record for record in records if len(done.get(record.id, ())) < k]
    if todo:
        if writer is None:
            from medfaq.summarizer.question_writer import QuestionWriter

            writer = QuestionWriter.load(config.writer, quantize=config.writer_int8)
        cache.parent.mkdir(parents=True, exist_ok=True)
        step = config.batch_size * 4
        with (
            cache.open("a", encoding="utf-8") as handle,
            tqdm(
                total=len(records), initial=len(records) - len(todo), desc="write questions", disable=not progress
            ) as bar,
        ):
            for start in range(0, len(todo), step):
                chunk = todo[start : start + step]
                seed = config.seed * 1_000_003 + len(done)  # each chunk its own seed: a resumed run stays seeded
                written = writer.write(
                    [faq_input(r) for r in chunk], k, seed=seed, batch_size=config.batch_size, top_p=config.top_p
                )
                for record, samples in zip(chunk, written, strict=True):
                    done[record.id] = samples
                    handle.write(json.dumps({"faq_id": record.id, "samples": samples}, ensure_ascii=False) + "\n")
                handle.flush()
                bar.update(len(chunk))
    return {record.id: done[record.id][:k] for record in records}


def read_generated(cache: Path) -> dict[str, list[str]]:
    """The cached samples by FAQ id (the last line of an FAQ wins); a line cut short by an interruption is
    dropped."""
    found: dict[str, list[str]] = {}
    if cache.is_file():
        for line in cache.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            found[row["faq_id"]] = row["samples"]
    return found


def split_development(
    generated: dict[str, list[str]], dev_faqs: int, seed: int
) -> tuple[list[DevQuery], dict[str, list[str]]]:
    """Hold back the first sample of each of `dev_faqs` seeded FAQs as a development query (the same queries for
    every K one cache serves); the other samples, blank ones and repeats dropped (the held-back text too), are for
    use."""
    rng = random.Random(seed)
    eligible = sorted(faq_id for faq_id, samples in generated.items() if samples and samples[0].strip())
    chosen = set(rng.sample(eligible, min(dev_faqs, len(eligible))))
    dev, rest = [], {}
    for faq_id, samples in generated.items():
        held = samples[0] if faq_id in chosen else None
        if held is not None:
            dev.append(DevQuery(held, frozenset([faq_id])))
        usable = (text for text in samples[1 if held is not None else 0 :] if text.strip() and text != held)
        rest[faq_id] = list(dict.fromkeys(usable))
    return dev, rest


def save_development(path: Path, queries: Sequence[DevQuery]) -> None:
    """The held-back questions, for other per-bank decisions (`medfaq index likelihood`)."""
    rows = (json.dumps({"text": q.text, "golds": sorted(q.golds)}, ensure_ascii=False) + "\n" for q in queries)
    path.write_text("".join(rows), encoding="utf-8")


def save_training_pairs(path: Path, kept: dict[str, list[str]], records: Sequence[FaqRecord]) -> None:
    """The questions that passed the round trip, each with the question of the FAQ it was written for (the
    ``{"chq", "faq"}`` rows a `--train-data` pairs file holds): golds from the bank itself, for training a
    summarizer to rank it (variant ``rank``). Never the held-back development questions."""
    question = {record.id: record.question for record in records}
    rows = (
        json.dumps({"id": f"{faq_id}:{number}", "chq": text, "faq": question[faq_id]}, ensure_ascii=False) + "\n"
        for faq_id, texts in kept.items()
        for number, text in enumerate(texts)
    )
    path.write_text("".join(rows), encoding="utf-8")


def training_pairs_file(directory: Path) -> Path:
    """The round-trip questions `medfaq index adapt` saved for the index in `directory`; a one-line error if none."""
    if not is_index(directory):
        raise MedfaqError(
            f"{directory} is not an index (no {MANIFEST}): a directory given as training data must be an index that "
            "`medfaq index adapt` wrote questions for"
        )
    path = work_dir(directory) / TRAINING_FILE
    if not path.is_file():
        raise MedfaqError(f"{directory}: no questions written for it yet; run `medfaq index adapt {directory}` first")
    return path


def round_trip(pipeline: Any, questions: dict[str, list[str]], depth: int) -> dict[str, list[str]]:
    """The questions whose own FAQ `pipeline` ranks in its top `depth` (0: all of them)."""
    if depth == 0:
        return {faq_id: list(texts) for faq_id, texts in questions.items()}
    flat = [(faq_id, text) for faq_id, texts in questions.items() for text in texts]
    ranked = ranked_ids(pipeline, [text for _, text in flat], depth)
    kept: dict[str, list[str]] = {faq_id: [] for faq_id in questions}
    for (faq_id, text), ids in zip(flat, ranked, strict=True):
        if faq_id in ids:
            kept[faq_id].append(text)
    return kept


def ranked_ids(pipeline: Any, queries: list[str], depth: int, batch_size: int = 64) -> list[list[str]]:
    """The `depth` FAQ ids `pipeline` (a :func:`ranking_config` one) ranks first for each query."""
    from tqdm.auto import tqdm

    ranked = []
    starts = range(0, len(queries), batch_size)
    for start in tqdm(starts, desc="search", disable=len(queries) <= batch_size * 4, leave=False):
        ranked += [[hit.id for hit in r.hits[:depth]] for r in pipeline.run_batch(queries[start : start + batch_size])]
    return ranked


def ranking_config(directory: Path, depth: int) -> Any:
    """The index's own pipeline config ranking at least `depth` and the development depth, with abstention, its
    log and the entity stage off: what the round trip and the development queries are searched with."""
    from medfaq.retriever.pipeline_file import read_config

    config = read_config(directory)
    return replace(config, top_k=max(depth, DEV_DEPTH), abstain=False, log_unanswered=False, entities=False)


def dev_scores(pipeline: Any, queries: Sequence[DevQuery]) -> dict[str, float]:
    """R@1 and MRR@10 (in %) of `pipeline` on `queries`."""
    if not queries:
        return {"r@1": 0.0, "mrr@10": 0.0, "queries": 0}
    ranked = ranked_ids(pipeline, [q.text for q in queries], DEV_DEPTH)
    recall_at_1, mrr, _ = first_hits(
        {str(n): ids for n, ids in enumerate(ranked)}, {str(n): q.golds for n, q in enumerate(queries)}, DEV_DEPTH
    )
    return {"r@1": round(recall_at_1, 2), "mrr@10": round(mrr, 2), "queries": len(queries)}


def without_rows(dev: Sequence[DevQuery], rows: dict[str, list[str]]) -> list[DevQuery]:
    """The held-back questions written for FAQs that `rows` gives no row: adding the rows can only push these down,
    so they are a development set of their own (none where every FAQ, or no FAQ, gets rows)."""
    given = {faq_id for faq_id, texts in rows.items() if texts}
    untouched = [query for query in dev if not query.golds & given]
    return untouched if len(untouched) < len(dev) else []


def part_kept(part: str, before: dict[str, dict], after: dict[str, dict]) -> bool:
    """The rule: no development set loses R@1, and at least one gains R@1 or MRR@10: the labelled one for a part
    learned from the generated questions."""
    if any(after[name]["r@1"] < before[name]["r@1"] for name in before):
        return False
    judges = [name for name in before if part not in LEARNED_PARTS or name == "labelled"]
    return any(
        after[name]["r@1"] > before[name]["r@1"] or after[name]["mrr@10"] > before[name]["mrr@10"] for name in judges
    )


def parts_to_try(config: AdaptConfig, records: Sequence[FaqRecord], labelled: bool) -> dict[str, str]:
    """Each part of ``config.parts`` that will not be tried, with why (``force`` tries all); :class:`NothingToAdapt`
    when none is left."""
    skipped = {}
    for part in config.parts:
        if part in LEARNED_PARTS and not (labelled or config.force):
            skipped[part] = NEEDS_LABELS
        elif part == "answers" and not any(record.answer.strip() for record in records):
            skipped[part] = "no FAQ of the bank has an answer"
    if len(skipped) == len(config.parts):
        reasons = {why: [part for part in skipped if skipped[part] == why] for why in skipped.values()}
        raise NothingToAdapt("nothing to adapt: " + "; ".join(f"{', '.join(p)}: {why}" for why, p in reasons.items()))
    return skipped


def writing_plan(
    config: AdaptConfig, skipped: dict[str, str], records: Sequence[FaqRecord]
) -> tuple[AdaptConfig, list[FaqRecord]]:
    """`config` with the questions to write per FAQ, and the FAQs to write them for: where no part learned from the
    generated questions is tried, only the held-back development questions are used, so one question each for a
    seeded sample of `dev_faqs` FAQs (all of a smaller bank)."""
    if any(part in LEARNED_PARTS and part not in skipped for part in config.parts):
        return config, list(records)
    chosen = set(random.Random(config.seed).sample(sorted(r.id for r in records), min(config.dev_faqs, len(records))))
    return replace(config, questions_per_faq=1), [record for record in records if record.id in chosen]


def answer_rows(records: Sequence[FaqRecord], words: int, with_question: bool = True) -> dict[str, list[str]]:
    """For each FAQ with an answer: the first `words` words of its answer and, `with_question`, its question followed
    by them."""
    heads = {r.id: (r.question, " ".join(r.answer.split()[:words])) for r in records if r.answer.strip()}
    return {faq: [head, f"{question} {head}"] if with_question else [head] for faq, (question, head) in heads.items()}


def add_rows(
    index: FaqIndex, rows: dict[str, list[str]], origin: str, progress: bool = False, staging: Path | None = None
) -> list[int]:
    """Add `rows` as phrasings of their FAQs, encoded in one pass (a bar with `progress`; resumable with `staging`,
    see :meth:`IndexEditor.add_phrasings_of`); the keys added."""
    added = index.editor().add_phrasings_of(rows, by=ADAPTED_BY, origin=origin, progress=progress, staging=staging)
    return [phrasing.key for phrasing in added]


def rows_staging(directory: Path, index: FaqIndex, part: str, rows: dict[str, list[str]]) -> Path:
    """Where a part's rows are encoded chunk by chunk, so an interrupted `adapt` encodes only the missing chunks
    when run again: named by the encoder and the rows, so other rows or another encoder never reuse it."""
    digest = hashlib.sha256(json.dumps([index.manifest.encoder_fingerprint, rows]).encode()).hexdigest()[:16]
    return work_dir(directory) / f"{part}-{digest}{ENCODING_SUFFIX}"


def remove_rows(index: FaqIndex, keys: list[int]) -> None:
    """Remove the rows under `keys`; where they were the last keys given out, they are given out again."""
    index.editor().remove_phrasings(keys)
    if max(keys) == index.manifest.next_key - 1 and len(keys) == index.manifest.next_key - min(keys):
        index.manifest.next_key = min(keys)


def adapted_keys(index: FaqIndex) -> list[int]:
    return [p.key for p in index.phrasings() if p.origin.startswith(ORIGIN_PREFIX)]


def adapt(
    directory: Path,
    config: AdaptConfig,
    user_dev: Sequence[DevQuery] = (),
    writer: Any = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Adapt the index in `directory` (see the module docstring) and save it; returns the record kept in its
    manifest. An index already adapted is a one-line error (undo first)."""
    from medfaq.retriever.model_cache import build_pipeline

    directory = Path(directory).expanduser()
    started = time.perf_counter()
    index = FaqIndex.load(directory)
    if index.manifest.adaptation:
        raise MedfaqError(f"index {directory} is already adapted; run `medfaq index adapt {directory} --undo` first")
    records = index.records()
    if not records:
        raise MedfaqError(f"index {directory} holds no FAQs to adapt")
    skipped = parts_to_try(config, records, bool(user_dev))
    searched = ranking_config(directory, config.round_trip_depth)
    pipeline = build_pipeline(index, searched)
    key = generation_key(config, writer)
    cache = work_dir(directory) / f"questions-{key}.jsonl"
    written_config, to_write = writing_plan(config, skipped, records)
    generated = generated_questions(to_write, written_config, cache, writer, progress)
    written = sum(len(q) for q in generated.values())
    dev, usable = split_development(generated, config.dev_faqs, config.seed)
    save_development(cache.parent / DEVELOPMENT_FILE, dev)
    dev_sets = {"generated": dev, **({"labelled": list(user_dev)} if user_dev else {})}
    kept = round_trip(pipeline, usable, config.round_trip_depth)
    save_training_pairs(cache.parent / TRAINING_FILE, kept, records)
    n_usable, n_kept = sum(len(q) for q in usable.values()), sum(len(q) for q in kept.values())
    trip = f"{n_kept} of {n_usable} passed the round trip (own FAQ in the top {config.round_trip_depth})"
    log(
        f"wrote {written} questions for {len(generated)} of {len(records)} FAQs; {len(dev)} held back for development"
        + (f"; {trip}" if n_usable else "")
    )
    candidates = {"answers": answer_rows(records, config.answer_words, config.answer_with_question), "phrasings": kept}
    scores = {name: dev_scores(pipeline, queries) for name, queries in dev_sets.items()}
    decisions: dict[str, dict[str, Any]] = {
        part: {"kept": False, "rows": 0, "why": why} for part, why in skipped.items()
    }
    current = scores
    for part in (part for part in PARTS if part in config.parts and part not in skipped and part != "encoder"):
        rows = candidates[part]
        judged = dev_sets | ({WITHOUT_ROWS: untouched} if (untouched := without_rows(dev, rows)) else {})
        before = current | {name: dev_scores(pipeline, judged[name]) for name in judged.keys() - current.keys()}
        keys = add_rows(index, rows, ORIGINS[part], progress, rows_staging(directory, index, part, rows))
        if not keys:
            decisions[part] = {"kept": False, "rows": 0, "why": "nothing to add"}
            continue
        after = {name: dev_scores(pipeline, queries) for name, queries in judged.items()}
        keep = part_kept(part, before, after) or config.force
        decisions[part] = {"kept": keep, "rows": len(keys), "dev": {name: after[name] for name in dev_sets}}
        if untouched:
            decisions[part][WITHOUT_ROWS] = {"before": before[WITHOUT_ROWS], "after": after[WITHOUT_ROWS]}
        log(
            f"{part}: {len(keys)} rows; development {describe(before)} -> {describe(after)}: "
            f"{'kept' if keep else 'not kept'}"
        )
        if keep:
            current = decisions[part]["dev"]
        else:
            remove_rows(index, keys)
    original_encoder = {"name": index.manifest.encoder, "backend": index.manifest.encoder_backend or "auto"}
    if "encoder" in config.parts and "encoder" not in skipped:
        decisions["encoder"], index = adapt_encoder(
            index, kept, dev_sets, current, config, searched, directory, key, log
        )
    record = {
        "adapted": utc_timestamp(),
        "config": asdict(config),
        "questions_written": written,
        "development_queries": {name: len(queries) for name, queries in dev_sets.items()},
        "round_trip": {"usable": n_usable, "kept": n_kept},
        "before": scores,
        "parts": {part: decisions[part] for part in PARTS if part in decisions},
        "applied": [part for part in PARTS if decisions.get(part, {}).get("kept")],
        "original_encoder": original_encoder,
        "faqs": len(records),
        "seconds": round(time.perf_counter() - started, 1),
    }
    index.manifest.adaptation = record
    with write_lock(directory):
        before = keep_before(directory)
        try:
            index.save(directory)
        except BaseException:
            discard_before(directory)
            raise
        if before is not None:
            (work_dir(directory) / BEFORE_VERSION_FILE).write_text(str(disk_version(directory)), encoding="utf-8")
    for staging in work_dir(directory).glob(f"*{ENCODING_SUFFIX}"):
        shutil.rmtree(staging, ignore_errors=True)
    return record


def adapt_encoder(
    index: FaqIndex,
    kept: dict[str, list[str]],
    dev_sets: dict[str, list[DevQuery]],
    current: dict[str, dict],
    config: AdaptConfig,
    searched: Any,
    directory: Path,
    key: str,
    log: Callable[[str], None],
) -> tuple[dict[str, Any], FaqIndex]:
    """Train the adapted encoder on the kept questions, encode the bank again with it and score the development
    queries with the `searched` pipeline config: (the decision, the index to keep: the re-encoded one where the rule
    keeps it, else `index`). The model is saved beside the index under the generated questions' `key`."""
    from medfaq.index.encoder import load_encoder
    from medfaq.retriever.biencoder.adapted import adaptation_triplets, teacher_margins, train_adapted_encoder
    from medfaq.retriever.model_cache import build_pipeline
    from medfaq.retriever.reranker.model import CrossEncoderReranker
    from medfaq.retriever.training.config import EncoderTrainConfig

    if not any(kept.values()):
        return {"kept": False, "rows": 0, "why": "no generated question passed the round trip"}, index
    triplets = adaptation_triplets(index, kept, config.encoder_negatives, config.near_duplicate)
    if not triplets:
        return {"kept": False, "rows": 0, "why": "every near miss was a near-duplicate of its FAQ"}, index
    labels, reranker = encoder_labels(config, searched.reranker)
    margins = teacher_margins(CrossEncoderReranker.load(reranker), triplets) if reranker else None
    train_config = EncoderTrainConfig(
        model_type="biencoder",
        task="faq",
        init=index.manifest.encoder,
        loss="mnrl",
        seed=config.seed,
        epochs=config.encoder_epochs,
        lr=config.encoder_lr,
        batch_size=16,
        max_length=64,
        extra={"adapted_from": str(directory), "labels": labels, "reranker": str(reranker or "")},
    )
    model = train_adapted_encoder(index.manifest.encoder, triplets, train_config, labels, margins)
    out = work_dir(directory) / f"encoder-{key[:8]}-{labels}"
    shutil.rmtree(out, ignore_errors=True)
    model.save(str(out))
    train_config.save(out)
    candidate = index.reencoded(load_encoder(str(out), index.manifest.encoder_backend or "auto"), progress=False)
    pipeline = build_pipeline(candidate, searched)
    after = {name: dev_scores(pipeline, queries) for name, queries in dev_sets.items()}
    keep = part_kept("encoder", current, after) or config.force
    log(
        f"encoder ({labels} labels, {len(triplets)} triplets): development {describe(current)} -> {describe(after)}: "
        f"{'kept' if keep else 'not kept'}"
    )
    decision = {"kept": keep, "rows": len(triplets), "labels": labels, "model": str(out), "dev": after}
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return decision, candidate if keep else index


def encoder_labels(config: AdaptConfig, named: str | None) -> tuple[str, Path | None]:
    """The encoder's labels and the reranker that gives margins: the index pipeline's reranker (`named`), else the
    set-up one; ``auto`` falls back to hard labels without either, ``margin`` then is a one-line error."""
    from medfaq.retriever.trained_models import set_up_reranker

    if config.encoder_labels == "hard":
        return "hard", None
    reranker = Path(resolve_model(named)) if named else set_up_reranker()
    if reranker is None and config.encoder_labels == "margin":
        raise MedfaqError("margin labels come from a reranker: run `medfaq setup` or set one in the index's pipeline")
    return ("margin", reranker) if reranker is not None else ("hard", None)


def describe(scores: dict[str, dict]) -> str:
    return ", ".join(f"{name} R@1 {s['r@1']:.1f} MRR@10 {s['mrr@10']:.1f}" for name, s in scores.items())


def keep_before(directory: Path) -> Path | None:
    """Keep the index's files as they are on disk, before the adaptation's save replaces them, in the work directory
    (hard links where the file system allows: a save never changes a file in place); None for an index whose vectors
    live outside its files (Milvus). Call it under the index's write lock."""
    before = work_dir(directory) / BEFORE_DIR
    discard_before(directory)
    if read_manifest(directory).backend.get("name", "faiss") != "faiss":
        return None

    def link(source: str, target: str) -> None:
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)

    shutil.copytree(directory, before, copy_function=link)
    return before


def kept_before(directory: Path) -> Path | None:
    """The index's files from before its adaptation, where they were kept and the index has not been saved since
    the adaptation (no `index add` or `delete`); else None."""
    version = work_dir(directory) / BEFORE_VERSION_FILE
    if not version.is_file() or version.read_text(encoding="utf-8") != disk_version(directory):
        return None
    return work_dir(directory) / BEFORE_DIR


def discard_before(directory: Path) -> None:
    (work_dir(directory) / BEFORE_VERSION_FILE).unlink(missing_ok=True)
    shutil.rmtree(work_dir(directory) / BEFORE_DIR, ignore_errors=True)


def original_encoder(record: dict[str, Any]) -> Any:
    """The encoder the adaptation replaced (loaded), or None where it kept the index's own."""
    from medfaq.index.encoder import load_encoder

    original = record.get("original_encoder") if "encoder" in record.get("applied", []) else None
    return load_encoder(original["name"], original["backend"]) if original else None


def undo(directory: Path) -> int:
    """Put back the index's files as they were before the adaptation (kept by `adapt`; the manifest's save counter
    moves on). Where they were not kept or the index was saved since (`index add`, `delete`), remove every row the
    adaptation added and its record instead, and encode the bank again with its original encoder where the
    adaptation replaced it. Returns the number of adapted rows removed."""
    directory = Path(directory).expanduser()
    record = read_manifest(directory).adaptation
    before = kept_before(directory)
    encoder = None if before else original_encoder(record)  # loaded before the write lock
    with write_lock(directory):
        index = FaqIndex.load(directory)
        keys = adapted_keys(index)
        if not keys and not index.manifest.adaptation:
            raise MedfaqError(f"index {directory} is not adapted; nothing to undo")
        if before is not None and kept_before(directory) != before:  # saved meanwhile: the rows are removed instead
            before, encoder = None, original_encoder(record)
        if before is not None:
            FaqIndex.load(before).save(directory)
        else:
            if keys:
                remove_rows(index, keys)
            index.manifest.adaptation = {}
            if encoder is not None:
                index = index.reencoded(encoder, progress=False)
            index.save(directory)
        discard_before(directory)
    return len(keys)


def adaptation_of(directory: Path) -> dict[str, Any]:
    """The manifest's record of the adaptation (empty: not adapted)."""
    return read_manifest(Path(directory).expanduser()).adaptation


def coverage(record: dict[str, Any], faqs_now: int) -> str:
    """Whether the adaptation still covers every FAQ of the index."""
    covered = record.get("faqs", 0)
    if faqs_now <= covered:
        return f"the adaptation covers all {faqs_now} FAQs"
    return (
        f"the adaptation covers {covered} of {faqs_now} FAQs (the newer ones have no written questions): "
        "run `medfaq index adapt DIR --undo`, then adapt again"
    )


def describe_adaptation(record: dict[str, Any], faqs_now: int) -> str:
    """One line for `index info`: what was applied, when, on what development numbers."""
    if not record:
        return "none"
    applied = ", ".join(record["applied"]) or "nothing kept"
    last = record["parts"][record["applied"][-1]]["dev"] if record["applied"] else record["before"]
    return f"{applied} ({record['adapted']}; development {describe(record['before'])} -> {describe(last)}; " + (
        coverage(record, faqs_now) + ")"
    )


def dry_run_plan(directory: Path, config: AdaptConfig, labelled: bool = False) -> str:
    """What `adapt` would do and how long it would take here (`labelled`: with the user's labelled development
    queries): the writer is timed on a few FAQs (nothing is written or saved). A bank with nothing to adapt is a
    plan too: it says why, at once."""
    from medfaq.summarizer.question_writer import QuestionWriter

    directory = Path(directory).expanduser()
    index = FaqIndex.load(directory)
    if index.manifest.adaptation:
        raise MedfaqError(f"index {directory} is already adapted; run `medfaq index adapt {directory} --undo` first")
    records = index.records()
    try:
        skipped = parts_to_try(config, records, labelled)
    except NothingToAdapt as nothing:
        return f"{len(records)} FAQs; {nothing}"
    written_config, to_write = writing_plan(config, skipped, records)
    k = written_config.questions_per_faq
    writer = QuestionWriter.load(writer_location(config.writer), quantize=config.writer_int8)
    cache = work_dir(directory) / f"questions-{generation_key(config, writer)}.jsonl"
    written = read_generated(cache)
    todo = [r for r in to_write if len(written.get(r.id, ())) < k]
    sample = todo[:SAMPLE_FAQS] or records[:SAMPLE_FAQS]
    start = time.perf_counter()
    writer.write([faq_input(r) for r in sample], k, config.seed, config.batch_size)
    per_faq = (time.perf_counter() - start) / max(len(sample), 1)
    minutes = per_faq * len(todo) / 60
    tried = [part for part in config.parts if part not in skipped]
    answers = answer_rows(records, config.answer_words, config.answer_with_question) if "answers" in tried else {}
    lines = [
        f"{len(records)} FAQs; {len(to_write)} to write for, {len(to_write) - len(todo)} of them already written in "
        f"{cache.parent}",
        f"write {k} question(s) for each of {len(todo)} FAQs: about {minutes:.1f} min "
        f"({per_faq:.2f} s per FAQ, measured on {len(sample)} here)",
        *([encoding_plan(index, answers, config.seed)] if answers else []),
        f"hold back one question of up to {config.dev_faqs} FAQs; round trip: keep questions whose FAQ ranks in the "
        f"top {config.round_trip_depth}",
        f"try {', '.join(tried)}, each kept only where it does not lose R@1 on the development queries "
        "(searching: about a minute per thousand FAQs; the encoder: about 5 minutes for 300 FAQs, docs/results.md)",
        *(f"not tried: {part}: {why}" for part, why in skipped.items()),
    ]
    return "\n".join(lines)


def encoding_plan(index: FaqIndex, rows: dict[str, list[str]], seed: int) -> str:
    """How long encoding the answer rows `rows` will take here, timed on a seeded sample of them."""
    texts = [text for row_texts in rows.values() for text in row_texts]
    sample = random.Random(seed).sample(texts, min(SAMPLE_ROWS, len(texts)))
    editor = index.editor()
    editor.phrasing_vectors(sample[:1])  # loads the encoder, untimed
    start = time.perf_counter()
    editor.phrasing_vectors(sample)
    per_row = (time.perf_counter() - start) / len(sample)
    return (
        f"encode {len(texts)} answer rows of {len(rows)} FAQs: about {per_row * len(texts) / 60:.1f} min "
        f"({per_row * 1000:.0f} ms per row, measured on {len(sample)} here)"
    )
