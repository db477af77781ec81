"""Where one training step of the set-up's retrieval recipe spends its time on CPU: stock MPNet, batches of 32
(question, FAQ, mined negative) triplets as the recipe builds them (questions cut at 128 tokens), the loss it trains
with (MultipleNegativesRankingLoss), AdamW, in the precision `auto` picks. The questions are a seeded sample of the
recipe's long (MeQSum, HealthCareMagic) and short (RQE, Quebec) sources in its proportions; each batch is timed in
its phases (forward, backward, optimiser step) on a seeded sample of the epoch's batches, and the question tokens
the whole epoch computes (padding included) counted, once with the batches mixed as the recipe drew them before
`--length-buckets` and once bucketed. Produced "Where a training step's
time goes" of docs/experiments/setup.md:

    python experiments/training_step_profile.py --data ../shared/data --steps 4
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from medfaq.common.runtime import autocast, resolve_precision
from medfaq.retriever.biencoder.scorer import load_biencoder
from medfaq.retriever.training.loop import make_batches
from medfaq.retriever.training.pair_data import query_source

SHARES = {"meqsum": 393, "healthcaremagic": 1314, "chq_summ": 554, "rqe": 1500, "quebec": 1094, "mqp": 1500}
"""Positives per source in the shipped model's training (its train_config.json, pair_counts)."""


def questions(data: Path, seed: int) -> list[tuple[str, str, str]]:
    """Triplets in the recipe's proportions: (question, its FAQ, another FAQ of the source's pool)."""
    rng = random.Random(seed)
    triplets = []
    for source, count in SHARES.items():
        query_set = query_source(source, data)
        answered = [(query, positive) for query, positive, _ in query_set.items if positive]
        picked = rng.sample(answered, min(count, len(answered)))
        triplets += [(query, positive, rng.choice(query_set.pool)) for query, positive in picked]
    return triplets


def profile(model, batches, precision: str) -> dict[str, float]:
    """Mean seconds per phase over `batches`, and the padded share of the question column."""
    import torch
    from sentence_transformers.sentence_transformer import losses
    from sentence_transformers.util import batch_to_device

    loss_fn = losses.MultipleNegativesRankingLoss(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-9)  # the step's cost, not its learning
    totals = {"forward": 0.0, "backward": 0.0, "optimiser": 0.0, "padded": 0.0}
    model.train()
    for batch in batches:
        columns = [batch_to_device(model.preprocess([t[i] for t in batch]), model.device) for i in range(3)]
        mask = columns[0]["attention_mask"]
        totals["padded"] += 1 - float(mask.sum()) / mask.numel()
        start = time.perf_counter()
        with autocast(precision):
            loss = loss_fn(columns, torch.zeros(len(batch)))
        forward = time.perf_counter()
        loss.backward()
        backward = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad()
        totals["forward"] += forward - start
        totals["backward"] += backward - forward
        totals["optimiser"] += time.perf_counter() - backward
    return {key: value / len(batches) for key, value in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--steps", type=int, default=4, help="Batches timed per arrangement (after one warm-up).")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    precision = resolve_precision("auto")
    model = load_biencoder("mpnet", "cpu")
    model.max_seq_length = 128
    triplets = questions(args.data, args.seed)
    keys = lambda triplet: triplet  # noqa: E731

    def token_count(text: str) -> int:
        return len(model.tokenizer(text, truncation=True, max_length=128)["input_ids"])

    print(f"{len(triplets)} triplets, precision {precision}, batch 32, questions cut at 128 tokens")
    print(
        "| batches | forward s | backward s | optimiser s | step s | question column padded | question tokens an "
        "epoch computes |\n|---|---|---|---|---|---|---|"
    )
    for name, length in (("mixed", None), ("bucketed", lambda t: len(t[0]))):
        batches = make_batches(triplets, 32, random.Random(args.seed), length=length, distinct=keys)
        batches = [batch for batch in batches if len(batch) == 32]
        computed = sum(max(map(token_count, (t[0] for t in batch))) * len(batch) for batch in batches)
        profile(model, batches[:1], precision)  # warm-up
        found = profile(model, random.Random(args.seed).sample(batches[1:], args.steps), precision)
        step = found["forward"] + found["backward"] + found["optimiser"]
        print(
            f"| {name} | {found['forward']:.2f} | {found['backward']:.2f} | {found['optimiser']:.2f} | {step:.2f} | "
            f"{100 * found['padded']:.0f} % | {computed:,} |"
        )


if __name__ == "__main__":
    main()
