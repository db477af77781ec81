"""`medfaq index build|add|delete|info|migrate|adapt|likelihood|rerank`.

Every write holds the index's lock (waiting for another write with one line, failing after --lock-timeout); the
index stack (numpy, FAISS, bm25s, the encoder) is imported inside the commands that use it.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import typer

from medfaq.app.config_options import takes_config_options
from medfaq.app.options import DEVICE, ENCODER_OPTION, NO_OVERRIDES, SYNONYMS_OPTION
from medfaq.common.runtime import BACKEND_HELP, MedfaqError, local_model_dir, resolve_model
from medfaq.index.collections import FORMATS
from medfaq.index.records import FIELDS
from medfaq.index.vector_store import INDEX_KINDS as KINDS
from medfaq.index.vector_store import VECTOR_BACKENDS
from medfaq.retriever.decisions.adaptation_config import AdaptConfig
from medfaq.retriever.decisions.encoder_rule import stock_encoder
from medfaq.retriever.trained_models import AUTO_ENCODER, choose_encoder, set_up_reranker

DEV_QUERIES_OPTION = typer.Option(None, "--dev-queries", help="Your labelled queries (BEIR queries.jsonl).")
DEV_QRELS_OPTION = typer.Option(None, "--dev-qrels", help="Their judgements (BEIR qrels.tsv or TREC).")
MEASURED_ON_OPTION = typer.Option(
    None,
    "--measured-on",
    help="Search the questions in this index instead: a copy of DIR with their gold FAQs added (a benchmark's).",
)
BACKEND_FILE = "backend.json"  # in the staging directory: the options a resumed build must reuse

FORMAT_HELP = f"Collection format: {'|'.join(FORMATS)}."
KIND_HELP = f"Index kind: {'|'.join(KINDS)} (FAISS, or Milvus' FLAT/IVF_FLAT/HNSW)."
FIELD_HELP = "Map a schema field to a source column of a generic JSONL/CSV file, e.g. --field question=title."


def open_encoder(name: str, backend: str = "auto", **options: Any) -> Any:
    """The encoder `--encoder NAME` chooses (`choose_encoder`), loaded on `backend` (`options` go to
    `index.encoder.load_encoder`) and named on stderr once it has loaded. First it is exported to ONNX Runtime for
    the index's searches where they run it there (`index.encoder.export_for_searches`), saying so on stderr; a model
    that cannot be exported is a warning line: its searches need ``--encoder-backend torch``."""
    from medfaq.index.encoder import export_for_searches, load_encoder
    from medfaq.index.model_files import check_model_directory

    chosen = choose_encoder(name)
    check_model_directory(resolve_model(chosen), chosen)  # no model, or another kind: an error, never a warning
    try:
        export_for_searches(chosen, lambda line: typer.echo(line, err=True))
    except MedfaqError as error:
        typer.echo(f"warning: {error}", err=True)
    encoder = load_encoder(chosen, backend, **options)
    note = ""
    if name == AUTO_ENCODER:
        stock = chosen == stock_encoder()
        note = " (auto: no fine-tuned encoder saved, the stock one the encoder rule chooses)" if stock else ""
        note = note or " (auto: the fine-tuned bi-encoder of `medfaq setup`)"
    typer.echo(f"encoder: {chosen}{note}", err=True)
    return encoder


def inherit_threshold(directory: Path, encoder: str, reranker: Path | None = None) -> dict[str, float]:
    """Give an index the abstention thresholds its encoder (and `reranker`, default the set-up one, when it corrects
    that encoder) were calibrated with, marked as inherited in its pipeline.json, and say so."""
    from medfaq.retriever.decisions.abstention import inherit_thresholds

    written = inherit_thresholds(directory, encoder, reranker or set_up_reranker())
    for key, value in written.items():
        typer.echo(f"{directory}: abstains below {value:.4f} ({key}), the threshold inherited from the model", err=True)
    return written


def check_choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise MedfaqError(f"unknown {option} {value!r}; choose one of {', '.join(choices)}")


BACKEND_OPTION = typer.Option("faiss", "--backend", help=f"Vector backend: {'|'.join(VECTOR_BACKENDS)}.")
URI_OPTION = typer.Option("", "--uri", help="Milvus: a Milvus Lite file (NAME.db) or a server (http://host:19530).")
COLLECTION_OPTION = typer.Option(None, "--collection", help="Milvus collection name (default: a new one).")
SHARDS_OPTION = typer.Option(1, "--shards", min=1, help="FAISS: split the vectors over N shards searched in parallel.")
GPU_OPTION = typer.Option(False, "--gpu", help="Require FAISS GPU search (default: used when a GPU is present).")
CPU_OPTION = typer.Option(False, "--cpu", help="Force the CPU for encoding and FAISS even when a GPU is present.")
ENCODER_BACKEND_OPTION = typer.Option("auto", "--encoder-backend", help=BACKEND_HELP)
LOCK_OPTION = typer.Option(
    None,
    "--lock-timeout",
    help="Seconds to wait for another write of the index (default: $MEDFAQ_LOCK_TIMEOUT or 600).",
)


def check_lock_timeout(value: float | None) -> None:
    if value is not None and not (value >= 0 and math.isfinite(value)):
        raise MedfaqError(f"--lock-timeout must be a number of seconds >= 0, not {value}")


def build(
    collection: str = typer.Argument(..., help="Collection file, or a fetched dataset name (medquad, quebec, jhu)."),
    out: Path = typer.Option(..., "--out", help="Index directory to write (replaced atomically if it exists)."),
    format: str = typer.Option("auto", "--format", help=FORMAT_HELP),
    encoder: str = ENCODER_OPTION,
    fields: str = typer.Option("question", "--fields", help=f"Text to index: {'|'.join(FIELDS)}."),
    kind: str = typer.Option("flat", "--kind", help=KIND_HELP),
    field: list[str] = typer.Option([], "--field", help=FIELD_HELP),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip malformed lines (counted) instead of failing."),
    device: str | None = DEVICE,
    gpu: bool = GPU_OPTION,
    cpu: bool = CPU_OPTION,
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Encoding batch size."),
    encoder_backend: str = ENCODER_BACKEND_OPTION,
    backend: str = BACKEND_OPTION,
    uri: str = URI_OPTION,
    collection_name: str | None = COLLECTION_OPTION,
    shards: int = SHARDS_OPTION,
    workers: int = typer.Option(1, "--workers", min=1, help="Encode in N processes (on CUDA: one per GPU)."),
    resume: bool = typer.Option(False, "--resume", help="Continue a killed build: encode only the missing chunks."),
    synonyms: str = SYNONYMS_OPTION,
    lock_timeout: float | None = LOCK_OPTION,
) -> None:
    """Build a dense (FAISS or Milvus) + BM25 index over an FAQ collection (an existing index is replaced
    atomically, under its lock; a collection without a single FAQ is refused and changes nothing)."""
    from medfaq.index.chunked_encoding import staging_dir
    from medfaq.index.collections import load_collection, parse_field_map
    from medfaq.index.concepts import concept_lexicon
    from medfaq.index.faq_index import FaqIndex
    from medfaq.index.storage import check_index_target
    from medfaq.retriever.runs import check_not_an_input

    check_choice("--kind", kind, KINDS)
    check_choice("--fields", fields, FIELDS)
    check_lock_timeout(lock_timeout)
    target = check_index_target(out)
    check_not_an_input(target, collection, local_model_dir(choose_encoder(encoder)), option="--out")
    options = backend_options(backend, uri, collection_name, target.name, gpu, cpu, shards)
    records, report = load_collection(collection, format, parse_field_map(field), skip_bad)
    if not records:
        raise MedfaqError(f"{report.path} holds no FAQs to index ({_skipped(report)}); {target} was not written")
    concepts = concept_lexicon(synonyms)
    sentence_encoder = open_encoder(encoder, encoder_backend, device="cpu" if cpu else device, batch_size=batch_size)
    typer.echo(report.summary(), err=True)
    if concepts is not None:
        known = f"{len(concepts.concepts):,} {concepts.source} concepts"
        typer.echo(f"FAQs that name one of {known} are also encoded with its synonyms", err=True)
    staging = staging_dir(target)
    if staging.exists() and not resume:
        shutil.rmtree(staging)
    options = _resumable(options, staging, collection_name)
    index = FaqIndex.build(
        records,
        sentence_encoder,
        fields=fields,
        kind=kind,
        backend=backend,
        backend_options=options,
        staging=staging,
        workers=workers,
        concepts=concepts,
    )
    target = index.save(out, timeout=lock_timeout)
    shutil.rmtree(staging, ignore_errors=True)
    inherit_threshold(target, sentence_encoder.name)
    typer.echo(f"indexed {len(index)} FAQs into {target}")


def _skipped(report: Any) -> str:
    """What a load that found no FAQ skipped, for the refusal line."""
    skipped = report.skips()
    return f"{'; '.join(skipped)}, none left" if skipped else "the file is empty"


def backend_options(
    backend: str, uri: str, collection: str | None, name: str, gpu: bool, cpu: bool, shards: int
) -> dict[str, Any]:
    """The vector store options the command-line flags ask for (`name`: the index directory's, for Milvus)."""
    check_choice("--backend", backend, tuple(VECTOR_BACKENDS))
    if gpu and cpu:
        raise MedfaqError("--gpu and --cpu exclude each other")
    if backend != "milvus" and (uri or collection):
        raise MedfaqError("--uri and --collection are options of --backend milvus")
    if backend != "faiss" and (gpu or shards != 1):
        raise MedfaqError("--gpu and --shards are options of --backend faiss (Milvus uses its server's resources)")
    if backend == "faiss":
        return {"use_gpu": False if cpu else (True if gpu else None), "shards": shards}
    from medfaq.index.milvus_store import collection_name as new_collection_name
    from medfaq.index.milvus_store import normalize_uri

    return {"uri": normalize_uri(uri), "collection": collection or new_collection_name(name)}


def _resumable(options: dict[str, Any], staging: Path, collection: str | None) -> dict[str, Any]:
    """A resumed Milvus build reuses (and refills) its first run's collection, which the staging directory names."""
    if "collection" not in options:
        return options
    saved = staging / BACKEND_FILE
    if saved.is_file():
        previous = json.loads(saved.read_text(encoding="utf-8"))
        if previous["uri"] == options["uri"] and collection in (None, previous["collection"]):
            return {**previous, "overwrite": True}
    staging.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(options) + "\n", encoding="utf-8")
    return options


def migrate(
    source: Path = typer.Argument(..., help="Index directory whose vectors move."),
    out: Path = typer.Option(..., "--out", help="Index directory to write (may be SOURCE: replaced atomically)."),
    backend: str = BACKEND_OPTION,
    uri: str = URI_OPTION,
    collection_name: str | None = COLLECTION_OPTION,
    kind: str | None = typer.Option(None, "--kind", help=f"{KIND_HELP} Default: the source index's kind."),
    shards: int = SHARDS_OPTION,
    gpu: bool = GPU_OPTION,
    cpu: bool = CPU_OPTION,
    lock_timeout: float | None = LOCK_OPTION,
) -> None:
    """Move an index to another vector backend (e.g. FAISS -> a Milvus cluster): vectors are copied, not re-encoded."""
    from medfaq.index.faq_index import FaqIndex
    from medfaq.index.lock import write_lock
    from medfaq.index.storage import check_index_target

    if kind is not None:
        check_choice("--kind", kind, KINDS)
    check_lock_timeout(lock_timeout)
    target = check_index_target(out)
    options = backend_options(backend, uri, collection_name, target.name, gpu, cpu, shards)
    with write_lock(target, lock_timeout):
        index = FaqIndex.load(source)
        moved = index.moved_to(backend, options, kind=kind)
        moved.save(target)
        for sidecar in Path(source).glob("*.json"):  # settings such as pipeline.json travel with the index
            if not (target / sidecar.name).exists():
                shutil.copy2(sidecar, target / sidecar.name)
    typer.echo(f"moved {len(moved)} FAQs to the {backend} backend; index at {target}")


def add(
    directory: Path = typer.Argument(..., help="Index directory."),
    collection: str = typer.Argument(..., help="Collection file with the new FAQs."),
    format: str = typer.Option("auto", "--format", help=FORMAT_HELP),
    field: list[str] = typer.Option([], "--field", help=FIELD_HELP),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip malformed lines (counted) instead of failing."),
    encoder_backend: str = ENCODER_BACKEND_OPTION,
    lock_timeout: float | None = LOCK_OPTION,
) -> None:
    """Add FAQs to an index (only the new ones are encoded); ids already in the index are an error.

    The index is read under its lock, so adds and deletes running at the same time all keep their changes."""
    from medfaq.index.collections import load_collection, parse_field_map
    from medfaq.index.faq_index import FaqIndex
    from medfaq.index.storage import read_manifest

    check_lock_timeout(lock_timeout)
    read_manifest(directory.expanduser())  # a wrong directory fails before the collection is read
    records, report = load_collection(collection, format, parse_field_map(field), skip_bad)
    if not records:
        raise MedfaqError(f"{report.path} holds no FAQs to add ({_skipped(report)}); {directory} was not changed")
    index, added = FaqIndex.add_to(directory, records, timeout=lock_timeout, backend=encoder_backend)
    typer.echo(report.summary(), err=True)
    typer.echo(f"added {added} FAQs; the index now holds {len(index)}")
    if added and index.manifest.adaptation:
        from medfaq.retriever.decisions.adaptation import coverage

        typer.echo(f"note: {coverage(index.manifest.adaptation, len(index))}", err=True)


def delete(
    directory: Path = typer.Argument(..., help="Index directory."),
    ids: list[str] = typer.Argument(..., help="FAQ ids to remove."),
    lock_timeout: float | None = LOCK_OPTION,
) -> None:
    """Remove FAQs by id (no re-encoding, no rebuild), under the index's lock."""
    from medfaq.index.faq_index import FaqIndex

    check_lock_timeout(lock_timeout)
    index, removed = FaqIndex.delete_from(directory, ids, timeout=lock_timeout)
    typer.echo(f"deleted {removed} FAQs; the index now holds {len(index)}")


def info(
    directory: Path = typer.Argument(..., help="Index directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the information as JSON."),
) -> None:
    """Show an index's manifest: encoder, dimension, fingerprint, fields, kind, counts, sources, version."""
    from medfaq.index.storage import index_info
    from medfaq.retriever.decisions import likelihood_choice, reranker_choice

    details = index_info(directory)
    decisions = {"likelihood": likelihood_choice, "reranker": reranker_choice}
    for key, decision in decisions.items():
        choice = decision.read_choice(directory)
        if choice is not None:
            details[key] = choice
    if as_json:
        typer.echo(json.dumps(details, indent=2))
        return
    for key, value in details.items():
        if key == "adaptation":
            from medfaq.retriever.decisions.adaptation import describe_adaptation

            value = describe_adaptation(value, details["counts"].get("records", 0))
        elif key in decisions:
            decision = decisions[key]
            value = decision.describe_choice(value) + decision.stale_note(value, details["encoder_fingerprint"])
        typer.echo(f"{key:<20} {json.dumps(value) if isinstance(value, (dict, list)) else value}")


@takes_config_options(AdaptConfig, "settings", with_defaults=True)
def adapt(
    directory: Path = typer.Argument(..., help="Index directory."),
    settings: Mapping[str, Any] = NO_OVERRIDES,
    dev_queries: Path | None = DEV_QUERIES_OPTION,
    dev_qrels: Path | None = DEV_QRELS_OPTION,
    undo: bool = typer.Option(False, "--undo", help="Remove everything an adaptation added."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be done and how long it would take."),
) -> None:
    """Teach an index its own bank: write questions for every FAQ, keep those that find their FAQ again, and add
    the FAQs' answers as extra rows where they do not lose R@1 on held-back questions (and on --dev-queries). Those
    questions as phrasings, and an encoder trained on them, are tried only with --dev-queries and kept only where
    those gain. Interrupted runs resume; --undo removes all of it."""
    from medfaq.retriever.decisions import adaptation

    if undo:
        removed = adaptation.undo(directory)
        typer.echo(f"removed {removed} adapted rows from {directory}")
        return
    labelled = _labelled_queries(dev_queries, dev_qrels)
    config = AdaptConfig(**settings)
    if dry_run:
        typer.echo(adaptation.dry_run_plan(directory, config, bool(labelled)))
        return
    record = adaptation.adapt(directory, config, labelled, log=lambda line: typer.echo(line, err=True))
    applied = ", ".join(record["applied"]) or "nothing (no part won on the development queries)"
    typer.echo(f"adapted {directory} in {record['seconds'] / 60:.1f} min: {applied}")


def likelihood(
    directory: Path = typer.Argument(..., help="Index directory."),
    summarizers: list[str] | None = typer.Option(
        None,
        "--summarizer",
        help="Summarizer directory (default: the best one trained under the models directory); repeat it to keep "
        "the one whose chosen setting wins most on the same questions (seeds of one recipe, say).",
    ),
    dev_queries: Path | None = DEV_QUERIES_OPTION,
    dev_qrels: Path | None = DEV_QRELS_OPTION,
    depth: int = typer.Option(10, "--depth", min=2, max=50, help="How many top hits the likelihood scores."),
    limit: int = typer.Option(0, "--limit", min=0, help="Score only the first N questions of each set (0: all)."),
    measured_on: Path | None = MEASURED_ON_OPTION,
    off: bool = typer.Option(False, "--off", help="Turn the stage off for this index, keeping the record."),
) -> None:
    """Decide whether the summarizer's likelihood stage ranks this bank better, on your labelled development
    questions (--dev-queries; those `medfaq index adapt` held back vote beside them), by a rule written down in
    advance; the outcome goes into the index's pipeline.json and likelihood.json."""
    from medfaq.retriever.decisions import likelihood_choice

    def decide(labelled: list[Any], log: Callable[[str], None]) -> dict[str, Any]:
        return likelihood_choice.choose_likelihood(
            directory, summarizers or [None], labelled, depth=depth, limit=limit, log=log, measured_on=measured_on
        )

    _decide_stage(directory, "likelihood stage", likelihood_choice, decide, off, dev_queries, dev_qrels)


def rerank(
    directory: Path = typer.Argument(..., help="Index directory."),
    reranker: str | None = typer.Option(
        None, "--reranker", help="Cross-encoder directory or name (default: the one `medfaq setup` trains)."
    ),
    dev_queries: Path | None = DEV_QUERIES_OPTION,
    dev_qrels: Path | None = DEV_QRELS_OPTION,
    limit: int = typer.Option(0, "--limit", min=0, help="Rank only the first N questions of each set (0: all)."),
    measured_on: Path | None = MEASURED_ON_OPTION,
    off: bool = typer.Option(False, "--off", help="Turn the reranker off for this index, keeping the record."),
) -> None:
    """Decide whether the cross-encoder reranker ranks this bank better than the index's pipeline without it, on
    your labelled development questions (--dev-queries; those `medfaq index adapt` held back vote beside them), by
    a rule written down in advance; the outcome goes into the index's pipeline.json and reranker.json."""
    from medfaq.retriever.decisions import reranker_choice

    def decide(labelled: list[Any], log: Callable[[str], None]) -> dict[str, Any]:
        return reranker_choice.choose_reranker(
            directory, reranker, labelled, limit=limit, log=log, measured_on=measured_on
        )

    _decide_stage(directory, "reranker", reranker_choice, decide, off, dev_queries, dev_qrels)


def _decide_stage(
    directory: Path, stage: str, decision: Any, decide: Callable[..., dict[str, Any]], off: bool, *dev: Path | None
) -> None:
    """A per-index stage decision (`decision`: its module): turned off by hand with `off`, else `decide(labelled,
    log)` on the labelled development questions `dev` (queries, qrels), and its one line printed."""
    from medfaq.index.storage import read_manifest

    read_manifest(directory)  # not an index: its one-line error, before anything loads
    if off:
        decision.turn_off(directory)
        typer.echo(f"{stage} off for {directory}")
        return
    record = decide(_labelled_queries(*dev), lambda line: typer.echo(line, err=True))
    typer.echo(decision.describe_choice(record))


def _labelled_queries(queries: Path | None, qrels: Path | None) -> list[Any]:
    """The user's development queries (--dev-queries, --dev-qrels: both or neither) with their relevant FAQ ids
    (queries without judgements are dropped); none when neither is given."""
    if (queries is None) != (qrels is None):
        raise MedfaqError("--dev-queries and --dev-qrels go together")
    if queries is None or qrels is None:
        return []
    from medfaq.common.ranking import read_qrels
    from medfaq.index.collections import iter_jsonl
    from medfaq.retriever.decisions.adaptation import DevQuery

    judged = read_qrels(qrels)
    found = [
        DevQuery(row["text"], frozenset(doc for doc, grade in judged[row["_id"]].items() if grade > 0))
        for _, row in iter_jsonl(queries)
        if judged.get(str(row.get("_id")))
    ]
    if not found:
        raise MedfaqError(f"none of the queries in {queries} has a judgement in {qrels}")
    return found
