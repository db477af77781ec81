"""Training examples: each CHQ-FAQ pair with its own hard negatives, and an epoch's batches of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from medfaq.summarizer.training.config import SummarizerTrainConfig


@dataclass(frozen=True)
class Example:
    """One training pair with its own hard negatives (kept together through batching)."""

    id: int
    chq: str
    faq: str
    negatives: tuple[str, ...] = ()


def epoch_batches(
    examples: Sequence[Example], batch_size: int, seed: int, epoch: int, bucket: int = 8
) -> list[list[Example]]:
    """The epoch's shuffled batches; the order depends only on (seed, epoch), so a resumed run sees the same.

    Within each shuffled window of `bucket` batches, examples are sorted by CHQ length before they are cut into
    batches (less padding, so faster steps); the batches are then shuffled again.
    """
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(len(examples), generator=generator).tolist()
    window = batch_size * max(bucket, 1)
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: len(examples[i].chq))
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    shuffled = torch.randperm(len(batches), generator=generator).tolist()
    return [[examples[i] for i in batches[b]] for b in shuffled]


def build_examples(pairs: Sequence[tuple[str, str]], config: SummarizerTrainConfig, start_id: int = 0) -> list[Example]:
    """Attach each pair's hard negatives as its own group: entity swaps (ECL) or focus swaps (QFCL), then
    `n_frame_negatives` question-frame swaps, then `n_retrieval_negatives` of the retrieval's near misses for the
    CHQ (read from `config.retrieval_negatives`)."""
    chqs, faqs = [p[0] for p in pairs], [p[1] for p in pairs]
    groups: list[list[str]] = [[] for _ in pairs]
    if config.uses_hard:
        from medfaq.summarizer.entities import load_recognizer
        from medfaq.summarizer.training import negatives

        qfcl = config.variant == "qfcl"
        entities: list = []
        if (not qfcl and config.n_hard_negatives > 0) or config.n_frame_negatives > 0:
            recognizer = load_recognizer()
            entities = [recognizer.find(faq) for faq in faqs]
        if config.n_hard_negatives > 0 and qfcl:
            groups = negatives.focus_hard_negatives(chqs, faqs, config.n_hard_negatives, config.seed)
        elif config.n_hard_negatives > 0:
            groups = negatives.entity_hard_negatives(faqs, config.n_hard_negatives, config.seed, entities=entities)
        if config.n_frame_negatives > 0:
            frames = negatives.frame_hard_negatives(faqs, config.n_frame_negatives, config.seed, entities)
            groups = [group + frame for group, frame in zip(groups, frames, strict=True)]
        if config.n_retrieval_negatives > 0:
            near_misses = read_retrieval_negatives(config.retrieval_negatives)
            groups = [
                group + near_misses.get(chq, [])[: config.n_retrieval_negatives]
                for group, chq in zip(groups, chqs, strict=True)
            ]
    return [Example(start_id + i, c, f, tuple(g)) for i, (c, f, g) in enumerate(zip(chqs, faqs, groups, strict=True))]


def read_retrieval_negatives(path: str) -> dict[str, list[str]]:
    """The near misses mined for each CHQ (``{"chq", "negatives"}`` lines; see ``medfaq train summarizer
    --retrieval-negatives``)."""
    import json

    from medfaq.common.runtime import MedfaqError

    if not path or not Path(path).is_file():
        raise MedfaqError(f"retrieval negatives file {path!r} not found (mined by `medfaq train summarizer`)")
    with open(path, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return {row["chq"]: list(row["negatives"]) for row in rows}
