"""What a student is distilled on: every question text of the project's training data, and its teacher's vectors
of them, encoded once into a cache beside the student's directory.

The texts: the MedQuAD questions, then both sides of the training splits the query -> FAQ task reads
(:data:`~retriever.training.config.FAQ_SOURCES` through :func:`~retriever.training.pair_data.query_source`: the
MeQSum, HealthCareMagic and CHQ-Summ training CHQs and their summaries, RQE train, MQP, the Quebec training queries and
FAQ questions), deduplicated (normalised text, the first source keeps it), without any question of a benchmark's
evaluation split (:func:`~retriever.training.pair_data.heldout_texts`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from medfaq.common.runtime import MedfaqError
from medfaq.index import chunked_encoding
from medfaq.index.collections import load_collection
from medfaq.index.encoder import SentenceEncoder, load_encoder, resolve_backend
from medfaq.index.pair_sources import dataset_file
from medfaq.retriever.training.config import FAQ_SOURCES
from medfaq.retriever.training.pair_data import heldout_texts, normalise, query_source, subsample

logger = logging.getLogger("medfaq.training")

TEXT_SOURCES = ("medquad", *FAQ_SOURCES)
TEACHER_INFO = "teacher.json"
TEACHER_TEXTS = "texts.jsonl"
TEACHER_VECTORS = "teacher_vectors.npy"
CHUNKS_DIR = "chunks"


@dataclass(frozen=True)
class SourceText:
    text: str
    source: str


def source_texts(source: str, data_root: Path | None = None, heldout: frozenset[str] = frozenset()) -> list[str]:
    """The question texts of one of :data:`TEXT_SOURCES` (training splits only), without the `heldout` ones
    (normalised) nor what they are paired with (a held-out CHQ's summary, the FAQ it entails)."""
    if source == "medquad":
        records, _ = load_collection(dataset_file("medquad", "medquad.jsonl", data_root), format="medquad")
        texts = [record.question for record in records]
    else:
        query_set = query_source(source, data_root)
        paired = {
            normalise(positive) for query, positive, _ in query_set.items if positive and normalise(query) in heldout
        }
        heldout = heldout | paired
        texts = [query for query, _, _ in query_set.items] + query_set.pool
    return [text for text in texts if normalise(text) not in heldout]


def distillation_texts(data_root: Path | None = None) -> list[SourceText]:
    """Every text of :data:`TEXT_SOURCES`, in their order, deduplicated, evaluation questions left out."""
    heldout = frozenset(heldout_texts(data_root))
    seen: set[str] = set()
    texts = []
    for source in TEXT_SOURCES:
        for text in source_texts(source, data_root, heldout):
            key = normalise(text)
            if key and key not in seen:
                seen.add(key)
                texts.append(SourceText(text, source))
    return texts


def split_texts(
    texts: list[SourceText], max_texts: int | None, dev_fraction: float, seed: int
) -> tuple[list[SourceText], list[SourceText]]:
    """(training texts, dev texts): a seeded sample of at most `max_texts`, `dev_fraction` of it (at least one text
    when above 0) held out."""
    sample = subsample(texts, max_texts, seed)
    n_dev = max(1, round(len(sample) * dev_fraction)) if dev_fraction else 0
    if len(sample) - n_dev < 1:
        raise MedfaqError(f"{len(sample)} texts leave none to train on after a dev fraction of {dev_fraction}")
    return sample[n_dev:], sample[:n_dev]


def source_counts(texts: list[SourceText]) -> dict[str, int]:
    """Texts per source, in :data:`TEXT_SOURCES` order."""
    counts = {source: 0 for source in TEXT_SOURCES}
    for item in texts:
        counts[item.source] = counts.get(item.source, 0) + 1
    return {source: count for source, count in counts.items() if count}


def teacher_encoder(name: str, backend: str = "auto", device: str | None = None) -> SentenceEncoder:
    """The teacher on `backend` (``index.encoder.ENCODER_BACKENDS``). ``auto``: PyTorch on a GPU; on the CPU, the
    fastest faithful encoder: bf16 weights where :func:`~index.encoder.resolve_backend` picks them, else ONNX int8
    where its check against the fp32 graph passed (it loads only then), else the ONNX fp32 export."""
    chosen = resolve_backend(backend, device)
    if backend == "auto" and chosen == "onnx":
        try:
            return load_encoder(name, "onnx-int8")
        except MedfaqError as error:  # no int8 graph agreed with the fp32 one
            logger.info("teacher %s on ONNX fp32: %s", name, error)
    return load_encoder(name, chosen, device)


def teacher_cache_dir(out: str | Path) -> Path:
    """Where the teacher's vectors for the student in `out` are kept: ``<out>.teacher`` beside it."""
    target = Path(out).expanduser().resolve()
    return target.parent / f"{target.name}.teacher"


def teacher_vectors(
    encoder: SentenceEncoder, texts: list[SourceText], cache: Path, progress: bool = True
) -> np.ndarray:
    """The teacher's unit vectors of `texts` (row i: text i), read from `cache` where it holds them for this teacher
    (fingerprint and backend) and these texts in this order, else encoded into it chunk by chunk
    (:func:`index.chunked_encoding.encode_chunks`): a run that was stopped, repeated, encodes only the missing chunks.

    `cache` holds ``teacher.json`` (teacher, fingerprint, backend, dimension, a digest of the texts),
    ``texts.jsonl`` (text and source, row by row) and ``teacher_vectors.npy``; a cache of other texts or another
    teacher is started over."""
    strings = [item.text for item in texts]
    info = {
        "teacher": encoder.name,
        "fingerprint": encoder.fingerprint,
        "backend": encoder.backend,
        "dim": encoder.dim,
        "texts": len(strings),
        "digest": chunked_encoding.chunks_fingerprint(f"{encoder.fingerprint}\0{encoder.backend}", strings),
    }
    if _read_info(cache) != info:
        if cache.exists():
            logger.warning("%s holds another teacher's vectors or other texts: encoding them again", cache)
            shutil.rmtree(cache)
        cache.mkdir(parents=True)
        rows = (json.dumps({"text": item.text, "source": item.source}, ensure_ascii=False) for item in texts)
        (cache / TEACHER_TEXTS).write_text("".join(f"{row}\n" for row in rows), encoding="utf-8")
        (cache / TEACHER_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    elif (cache / TEACHER_VECTORS).is_file():
        logger.info("teacher vectors read from %s", cache)
        return np.load(cache / TEACHER_VECTORS)
    vectors = chunked_encoding.encode_chunks(
        encoder.encode, strings, encoder.dim, cache / CHUNKS_DIR, info["digest"], progress, "teacher vectors"
    )
    partial = cache / f".{TEACHER_VECTORS}.partial.npy"
    np.save(partial, vectors)
    os.replace(partial, cache / TEACHER_VECTORS)
    shutil.rmtree(cache / CHUNKS_DIR)
    return vectors


def _read_info(cache: Path) -> dict | None:
    """The cache's ``teacher.json``; None where there is none (no cache, or one stopped before it was written); a
    one-line error where `cache` is something else."""
    if not cache.exists() or (cache.is_dir() and set(os.listdir(cache)) <= {TEACHER_TEXTS}):
        return None
    try:
        return json.loads((cache / TEACHER_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise MedfaqError(f"{cache} exists and is no cache of teacher vectors; move it away") from None
