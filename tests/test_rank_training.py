"""Variant rank (summarizer/training): the reference FAQ competes with its hard negatives on the sequence likelihood
the pipeline's likelihood stage reads, for both backbones, on tiny random models."""

from __future__ import annotations

import pytest
import torch

from medfaq.common.runtime import MedfaqError
from medfaq.summarizer.likelihood import SummaryLikelihood, combine
from medfaq.summarizer.training.examples import Example
from medfaq.summarizer.training.trainer import SummarizerTrainer
from tests.conftest import SUMMARY_PAIRS as PAIRS
from tests.conftest import tiny_summarizer_config
from tests.test_summarizer_causal import tiny_gemma_dir  # noqa: F401 (fixture)

NEGATIVES = {
    0: ("Can aspirin cause stomach ulcers?", "What is ibuprofen?"),
    1: ("Is albuterol safe for adults?",),
    2: (),  # no negative: this example adds nothing to the ranking loss
    3: ("Where can I find clinical trials for lymphoma?", "What causes leukemia?"),
}


def _examples() -> list[Example]:
    return [Example(i, chq, faq, NEGATIVES[i]) for i, (chq, faq) in enumerate(PAIRS[:4])]


def _trainer(backbone, tmp_path, variant="rank", **overrides) -> SummarizerTrainer:
    config = tiny_summarizer_config(variant, backbone=str(backbone), n_hard_negatives=2, seed=0, **overrides)
    return SummarizerTrainer(config, tmp_path / variant)


@pytest.fixture(params=["gemma", "bert2bert"])
def backbone(request, tiny_bert_dir):
    return request.getfixturevalue("tiny_gemma_dir") if request.param == "gemma" else tiny_bert_dir


def stage_ranking_loss(trainer: SummarizerTrainer, prior: float, temperature: float) -> float:
    """The ranking loss computed from the likelihood stage's own scores of the trainer's model (in eval mode)."""
    trainer.model.eval()
    stage = SummaryLikelihood(trainer.network, trainer.tokenizer, trainer.config.max_source_len, 12)
    stage.keep([text for example in _examples() for text in (example.faq, *example.negatives)])
    losses = []
    for example in _examples():
        if example.negatives:
            candidates = [example.faq, *example.negatives]
            given, empty = stage.token_scores(example.chq, candidates), stage.token_scores("", candidates)
            scores = torch.tensor(combine(given, empty, prior, per_token=False))
            losses.append(-torch.log_softmax(scores / temperature, dim=0)[0])
    return float(torch.stack(losses).mean())


@pytest.mark.parametrize("prior", [0.0, 1.0])
def test_the_ranking_loss_scores_candidates_as_the_likelihood_stage_does(backbone, prior, tmp_path):
    trainer = _trainer(backbone, tmp_path, rank_prior=prior, rank_temperature=2.0)
    trainer.model.eval()  # no dropout: the two computations must agree exactly
    batch = trainer.collator(_examples())
    assert batch.candidates.shape[:2] == (4, 3)
    trainer.keep_rank_vocabulary(_examples())  # what `train` does: the stage's trimmed softmax, over these FAQs
    assert (trainer.rank_vocabulary is not None) == trainer.causal
    with torch.no_grad():
        loss = trainer._rank_loss(batch)
    assert float(loss) == pytest.approx(stage_ranking_loss(trainer, prior, 2.0), abs=1e-4)


def test_rank_training_teaches_the_reference_over_its_negatives_and_mle_does_not(backbone, tmp_path):
    def ranking_loss_after(variant: str) -> float:
        trainer = _trainer(backbone, tmp_path, variant=variant)
        optimizer = torch.optim.AdamW([p for p in trainer.model.parameters() if p.requires_grad], lr=3e-3)
        batch = trainer.collator(_examples())
        trainer.model.train()
        for _ in range(12):
            loss, parts, _ = trainer.losses(batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        assert ("rank" in parts) == (variant == "rank")
        return stage_ranking_loss(trainer, prior=1.0, temperature=1.0)

    assert ranking_loss_after("rank") < 0.5 * ranking_loss_after("mle")


def test_rank_settings_are_checked():
    with pytest.raises(MedfaqError, match="rank_temperature must be a finite number above 0"):
        tiny_summarizer_config("rank", rank_temperature=0)
    for option in ("rank_weight", "rank_prior"):
        with pytest.raises(MedfaqError, match=f"{option} must be a finite number of at least 0"):
            tiny_summarizer_config("rank", **{option: -1.0})
    with pytest.raises(MedfaqError, match="--n-hard-negatives or --retrieval-negatives"):
        tiny_summarizer_config("rank", n_hard_negatives=0)
    assert tiny_summarizer_config("rank", n_hard_negatives=0, n_retrieval_negatives=2).hard_slots == 2
