"""The adapted encoder of `medfaq index adapt`: the index's bi-encoder continued on its own bank's generated questions
(GPL, Wang et al., NAACL 2022). Each generated question, its FAQ and a near miss mined from the same bank (false
negatives removed as in the pair set) make one triplet, labelled either by the reranker's margin (``margin``: the
student's cosine margin regressed onto the reranker's, margin-MSE) or with hard labels (``hard``, the control: the
FAQ against the near miss and the batch's other FAQs, MultipleNegativesRankingLoss)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from medfaq.common.runtime import MedfaqError
from medfaq.retriever.biencoder.scorer import load_biencoder
from medfaq.retriever.training.config import EncoderTrainConfig
from medfaq.retriever.training.loop import train_loop
from medfaq.retriever.training.pair_data import NEAR_DUPLICATE, normalise, retrieval_near_misses

LABELS = ("margin", "hard")
Triplet = tuple[str, str, str]


def adaptation_triplets(
    index: Any, questions: Mapping[str, list[str]], n_negatives: int = 1, near_duplicate: float = NEAR_DUPLICATE
) -> list[Triplet]:
    """(generated question, its FAQ's question, a near miss) for each question and each of its `n_negatives`
    mined near misses (the FAQ questions the index ranks highest for it, false negatives removed: those within
    `near_duplicate` cosine of the FAQ)."""
    pairs = [(text, index.get(faq_id).question) for faq_id, texts in questions.items() for text in texts]
    if not pairs:
        return []
    misses = retrieval_near_misses(index, pairs, n_negatives, near_duplicate)
    negatives = {row["chq"]: row["negatives"] for row in misses}
    return [(text, faq, negative) for text, faq in pairs for negative in negatives.get(text, [])]


def teacher_margins(reranker: Any, triplets: Sequence[Triplet]) -> np.ndarray:
    """The reranker's score of (question, FAQ) less its score of (question, near miss), per triplet."""
    positives = reranker.score_pairs([(q, pos) for q, pos, _ in triplets], progress=len(triplets) > 256)
    negatives = reranker.score_pairs([(q, neg) for q, _, neg in triplets], progress=len(triplets) > 256)
    return np.asarray(positives, dtype=np.float32) - np.asarray(negatives, dtype=np.float32)


def cosine_margins(model: Any, triplets: Sequence[Triplet]) -> np.ndarray:
    """The bi-encoder's cosine of (question, FAQ) less that of (question, near miss), per triplet."""
    columns = [
        model.encode([t[i] for t in triplets], normalize_embeddings=True, convert_to_numpy=True) for i in range(3)
    ]
    return np.sum(columns[0] * columns[1], axis=1) - np.sum(columns[0] * columns[2], axis=1)


def train_adapted_encoder(
    init: str, triplets: Sequence[Triplet], config: EncoderTrainConfig, labels: str, margins: np.ndarray | None = None
):
    """Continue the bi-encoder `init` on `triplets`; with ``margin`` labels, `margins` are the reranker's, rescaled
    to the spread of the student's own starting cosine margins (a reranker scores on its own scale). Returns the
    SentenceTransformer (eval mode)."""
    import torch
    import torch.nn.functional as F
    from sentence_transformers.sentence_transformer import losses
    from sentence_transformers.util import batch_to_device

    if labels not in LABELS:
        raise MedfaqError(f"unknown labels {labels!r}; choose one of {', '.join(LABELS)}")
    if not triplets:
        raise MedfaqError("no generated questions to adapt the encoder on")
    model = load_biencoder(init)
    inference_length = model.max_seq_length
    model.max_seq_length = config.max_length or inference_length

    def embed(texts: list[str]):
        return F.normalize(model(batch_to_device(model.preprocess(texts), model.device))["sentence_embedding"], dim=-1)

    if labels == "margin":
        if margins is None or len(margins) != len(triplets):
            raise MedfaqError("margin labels need one reranker margin per triplet")
        start = cosine_margins(model, triplets)
        scale = float(np.std(start) / max(float(np.std(margins)), 1e-6))
        examples: list = [(t, float(m) * scale) for t, m in zip(triplets, margins, strict=True)]

        def step(batch: list) -> Any:
            query, positive, negative = (embed([t[i] for t, _ in batch]) for i in range(3))
            student = (query * positive).sum(-1) - (query * negative).sum(-1)
            target = torch.tensor([m for _, m in batch], device=student.device, dtype=student.dtype)
            return F.mse_loss(student, target)

        distinct = None
    else:
        loss = losses.MultipleNegativesRankingLoss(model)
        examples = list(triplets)

        def step(batch: list) -> Any:
            columns = [batch_to_device(model.preprocess([t[i] for t in batch]), model.device) for i in range(3)]
            return loss(columns, torch.zeros(len(batch), device=model.device))

        def distinct(triplet: Triplet):
            return [normalise(triplet[1])]  # no FAQ twice in a batch: it would be its own in-batch negative

    train_loop(model, step, examples, config, desc=f"adapt encoder ({labels} labels)", distinct=distinct)
    model.max_seq_length = inference_length
    return model
