"""MoCo pieces of ECL: queue, momentum update, InfoNCE masking, learned negatives."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from medfaq.summarizer.training.contrastive import (
    KeyQueue,
    NegativeGenerator,
    diversity_loss,
    info_nce,
    masked_mean,
    mean_cosine,
    momentum_copy,
    momentum_update,
)


def test_queue_is_fifo_with_fixed_size_and_masks_own_examples():
    queue = KeyQueue(size=5, dim=2)
    _, mask = queue.negatives_for(torch.tensor([0]))
    assert not mask.any()  # empty queue: no negatives yet
    for start in (0, 3):
        ids = torch.arange(start, start + 3)
        queue.enqueue(torch.stack([ids.float(), -ids.float()], dim=1), ids)
    assert queue.keys.shape == (5, 2) and int(queue.filled) == 5
    # ids 0..5 went in; the oldest (0) was overwritten by 5
    assert sorted(queue.ids.tolist()) == [1, 2, 3, 4, 5]
    assert queue.keys[0].tolist() == [5.0, -5.0] and int(queue.pointer) == 1
    keys, mask = queue.negatives_for(torch.tensor([3, 9]))
    assert mask.shape == (2, 5)
    assert mask[0].sum() == 4 and not mask[0][queue.ids == 3].any()
    assert mask[1].all()
    assert torch.equal(keys, queue.keys)


def test_queue_keeps_only_the_newest_of_a_batch_larger_than_itself():
    queue = KeyQueue(size=3, dim=1)
    queue.enqueue(torch.arange(5.0).unsqueeze(1), torch.arange(5))
    assert sorted(queue.ids.tolist()) == [2, 3, 4] and int(queue.filled) == 3


def test_momentum_update_formula_is_exact():
    torch.manual_seed(0)
    key, query = nn.Linear(3, 2), nn.Linear(3, 2)
    before = [p.clone() for p in key.parameters()]
    momentum_update(key, query, 0.9)
    for old, new, q in zip(before, key.parameters(), query.parameters(), strict=True):
        assert torch.allclose(new, 0.9 * old + 0.1 * q, atol=0, rtol=1e-6)


def test_momentum_copy_shares_frozen_parameters_and_updates_only_the_trained_ones():
    torch.manual_seed(0)
    query = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 2))
    query[0].requires_grad_(False)
    key = momentum_copy(query)
    assert key[0].weight is query[0].weight and key[1].weight is not query[1].weight
    assert not any(p.requires_grad for p in key.parameters()) and query[1].weight.requires_grad
    frozen = query[0].weight.clone()
    before = key[1].weight.clone()
    with torch.no_grad():
        query[1].weight.add_(1.0)
    momentum_update(key, query, 0.5)
    assert torch.equal(query[0].weight, frozen)
    assert torch.allclose(key[1].weight, 0.5 * before + 0.5 * query[1].weight)


def test_queue_and_momentum_are_sized_to_the_run():
    from medfaq.summarizer.training.trainer import sized_momentum, sized_queue

    assert sized_queue(400, 8) == 200 and sized_queue(100_000, 8) == 4096 and sized_queue(5, 8) == 8
    assert sized_momentum(100) == pytest.approx(0.9) and sized_momentum(400) == pytest.approx(0.975)
    assert sized_momentum(1_000_000) == 0.999


def test_negative_generator_draws_noise_per_negative():
    torch.manual_seed(0)
    generator = NegativeGenerator(dim=8, count=3, hidden=16)
    positive = F.normalize(torch.randn(1, 8), dim=-1)
    negatives = generator(positive)[0]
    assert not torch.allclose(negatives[0], negatives[1]) and not torch.allclose(negatives[1], negatives[2])


def test_masked_mean_ignores_padding_and_normalises():
    hidden = torch.tensor([[[1.0, 0.0], [3.0, 4.0], [100.0, 100.0]]])
    pooled = masked_mean(hidden, torch.tensor([[1, 1, 0]]))
    assert torch.allclose(pooled, F.normalize(torch.tensor([[2.0, 2.0]]), dim=-1))


def test_info_nce_matches_hand_computation_and_skips_examples_without_negatives():
    anchor = F.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), dim=-1)
    positive = F.normalize(torch.tensor([[1.0, 1.0], [0.0, 1.0]]), dim=-1)
    negatives = torch.tensor([[[0.0, 1.0], [1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]]])
    mask = torch.tensor([[True, False], [False, False]])
    loss = info_nce(anchor, positive, negatives, mask, temperature=0.5)
    pos, neg = (1 / math.sqrt(2)) / 0.5, 0.0
    expected = -(pos - math.log(math.exp(pos) + math.exp(neg)))  # only the first example counts
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert info_nce(anchor, positive, negatives, torch.zeros_like(mask), 0.5).item() == 0.0
    assert mean_cosine(anchor, negatives, mask) == pytest.approx(0.0)


def test_negative_generator_shapes_and_diversity():
    torch.manual_seed(0)
    generator = NegativeGenerator(dim=8, count=3, hidden=16)
    positive = F.normalize(torch.randn(4, 8), dim=-1)
    negatives = generator(positive)
    assert negatives.shape == (4, 3, 8)
    assert torch.allclose(negatives.norm(dim=-1), torch.ones(4, 3), atol=1e-5)
    same = positive.unsqueeze(1).expand(4, 3, 8)
    assert diversity_loss(same).item() == pytest.approx(1.0, abs=1e-5)
    assert diversity_loss(negatives).item() < 1.0


def test_negative_similarity_plot_writes_a_png_for_one_or_several_runs(tmp_path):
    from experiments.plots import main, negative_similarity_plot
    from medfaq.common.runtime import MedfaqError

    histories = []
    for seed, epochs in enumerate(((1, 2), (1, 2, 3))):
        records = [
            {"stage": "main", "epoch": e, "train_cos_hard": 0.5 + e / 10, "train_cos_simple": 0.1} for e in epochs
        ]
        histories.append(tmp_path / f"history-{seed}.json")
        histories[-1].write_text(json.dumps(records))
    png = negative_similarity_plot(histories[:1], tmp_path / "fig" / "cos.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    main([*map(str, histories), "--out", str(tmp_path / "seeds.png")])
    assert (tmp_path / "seeds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    histories[0].write_text(json.dumps([{"stage": "main", "epoch": 1, "train_ce": 2.0}]))
    with pytest.raises(MedfaqError, match="no anchor/negative"):
        negative_similarity_plot(histories[:1], tmp_path / "none.png")
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "missing.json"), "--out", str(tmp_path / "x.png")])
    assert exit_info.value.code == 2
