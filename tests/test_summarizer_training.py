"""The ECL trainer on a tiny random encoder-decoder: batching of hard negatives, every variant, save/resume/reload."""

from __future__ import annotations

import json

import pytest
import torch

from medfaq.common.runtime import UNFINISHED_FILE, MedfaqError, resumable_run
from medfaq.retriever.trained_models import model_ready
from medfaq.summarizer.decoding import Decoding
from medfaq.summarizer.generation import Summarizer
from medfaq.summarizer.training.collator import Collator
from medfaq.summarizer.training.config import CONFIG_FILE, VARIANTS, preset_config
from medfaq.summarizer.training.examples import Example, build_examples, epoch_batches
from medfaq.summarizer.training.trainer import LAST_DIR, SummarizerTrainer, train_summarizer
from tests.conftest import SUMMARY_PAIRS as PAIRS
from tests.conftest import tiny_summarizer_config


def tiny_config(variant: str, **overrides):
    return tiny_summarizer_config(variant, **{"backbone": None, "queue_size": 16, **overrides})


def test_collator_keeps_each_examples_hard_negatives_with_it(tiny_bert_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert_dir))
    examples = [
        Example(i, f"question {i}", f"answer {i}", tuple(f"negative {i} {k}" for k in range(i % 3))) for i in range(7)
    ]
    collator = Collator(tokenizer, 16, 16, n_hard=2, strip_start=tokenizer.cls_token_id)
    seen = []
    for batch_examples in epoch_batches(examples, batch_size=3, seed=5, epoch=1):
        batch = collator(batch_examples)
        ids = batch.ids.tolist()
        seen += ids
        keys = tokenizer.batch_decode(batch.keys["input_ids"], skip_special_tokens=True)
        assert keys[: len(ids)] == [f"answer {i}" for i in ids]  # positives first, then the valid negatives
        expected = []
        for row, example_id in enumerate(ids):
            count = min(example_id % 3, 2)
            assert batch.negative_mask[row].tolist() == [slot < count for slot in range(2)]
            expected += [f"negative {example_id} {slot}" for slot in range(count)]
        assert keys[len(ids) :] == expected
        labels = [[t for t in row if t != -100] for row in batch.labels.tolist()]
        assert all(row[0] != tokenizer.cls_token_id for row in labels)  # BERT2BERT targets start after [CLS]
    assert seen != sorted(seen) and sorted(seen) == list(range(7))  # shuffled, each example once


def test_frame_negatives_follow_the_entity_negatives_in_each_group():
    pairs = [("chq 1", "What are the treatments for asthma?"), ("chq 2", "Who makes ibuprofen?")]
    plain = build_examples(pairs, tiny_config("ecl", n_hard_negatives=1))
    framed = build_examples(pairs, tiny_config("ecl", n_hard_negatives=1, n_frame_negatives=1))
    assert [e.negatives[:1] for e in framed] == [e.negatives for e in plain]
    assert [e.negatives[1:] for e in framed] == [("Who makes asthma?",), ("What are the treatments for ibuprofen?",)]
    assert all(not e.negatives for e in build_examples(pairs, tiny_config("mle", n_frame_negatives=1)))


def test_hard_negatives_never_enter_the_queue(tiny_bert_dir, tmp_path):
    config = tiny_config("ecl", backbone=str(tiny_bert_dir))
    trainer = SummarizerTrainer(config, tmp_path / "run")
    trainer.build_moco(largest_stage=6, steps_total=3)
    examples = [Example(i, c, f, (f"{f} again", f"not {f}")) for i, (c, f) in enumerate(PAIRS[:3])]
    batch = trainer.collator(examples)
    trainer.losses(batch)
    queue = trainer.moco.queue
    assert int(queue.filled) == 3 and sorted(queue.ids[:3].tolist()) == [0, 1, 2]
    positives = trainer.moco.keys(**batch.keys)[:3]
    assert torch.allclose(queue.keys[:3], positives, atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_trains_saves_reloads_and_generates(variant, tiny_bert_dir, tmp_path):
    out = tmp_path / variant
    history = train_summarizer(tiny_config(variant, backbone=str(tiny_bert_dir)), PAIRS[:4], PAIRS[4:], out)
    record = history[-1]
    assert record["step"] == 2 and record["best"] and "valid_rougeL" in record
    assert all(torch.isfinite(torch.tensor(v)) for k, v in record.items() if k.startswith("train_"))
    if variant in {"ecl", "ecl-s", "qfcl"}:
        assert "train_hcl" in record and "train_cos_hard" in record
    if variant == "learned":
        assert "train_lcl" in record and "train_diversity" in record
    for directory in (out, out / LAST_DIR):
        assert json.loads((directory / CONFIG_FILE).read_text())["variant"] == variant
    assert (out / "model.safetensors").is_file()
    texts = [PAIRS[0][0], PAIRS[1][0], "short"]
    summaries = Summarizer.load(out).summarize(texts, Decoding(max_length=5), batch_size=2)
    assert len(summaries) == 3 and all(isinstance(s, str) for s in summaries)


def test_quantized_summarizer_has_int8_linear_layers_and_generates(tiny_bert_dir, tmp_path):
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    out = tmp_path / "mle"
    train_summarizer(tiny_config("mle", backbone=str(tiny_bert_dir)), PAIRS[:4], PAIRS[4:], out)
    quantized = Summarizer.load(out, quantize=True)
    layers = list(quantized.model.modules())
    assert quantized.device == "cpu" and any(isinstance(m, DynamicQuantizedLinear) for m in layers)
    assert not any(type(m) is torch.nn.Linear for m in layers)
    summaries = quantized.summarize([PAIRS[0][0], "short"], Decoding(max_length=5))
    assert len(summaries) == 2 and all(isinstance(s, str) for s in summaries)
    with pytest.raises(MedfaqError, match="decoder-only"):
        Summarizer.load(out, quantize=True, int8_backend="ctranslate2")


def test_resumed_run_continues_with_the_same_losses(tiny_bert_dir, tmp_path):
    def run(out, max_steps, resume=False):
        losses = {}
        config = tiny_config("learned", backbone=str(tiny_bert_dir), max_steps=max_steps, epochs=2)
        trainer = SummarizerTrainer(config, out, resume=resume)
        trainer.train(PAIRS[:4] + PAIRS[:2], PAIRS[4:], on_step=lambda step, loss: losses.setdefault(step, loss))
        return losses

    full = run(tmp_path / "full", max_steps=5)
    first = run(tmp_path / "cut", max_steps=2)
    assert first == {1: full[1], 2: full[2]}
    rest = run(tmp_path / "cut", max_steps=5, resume=True)
    assert sorted(rest) == [3, 4, 5]
    assert rest == {step: full[step] for step in (3, 4, 5)}


def test_a_run_is_marked_unfinished_until_it_ends_and_one_without_a_checkpoint_starts_again(tiny_bert_dir, tmp_path):
    out, backbone = tmp_path / "run", str(tiny_bert_dir)
    SummarizerTrainer(tiny_config("mle", backbone=backbone, epochs=2, max_steps=3), out).train(PAIRS[:4], PAIRS[4:])
    # stopped in its second epoch: the first epoch's model is saved, yet the run is to be resumed, not used
    assert (out / "config.json").is_file() and resumable_run(out) and not model_ready(out)
    with pytest.raises(
        MedfaqError, match=r"stopped training before its end: .*`medfaq train summarizer --out .* --resume`"
    ):
        Summarizer.load(out)
    SummarizerTrainer(tiny_config("mle", backbone=backbone, epochs=2), out, resume=True).train(PAIRS[:4], PAIRS[4:])
    assert model_ready(out) and not (out / UNFINISHED_FILE).exists()
    stopped = tmp_path / "stopped"  # as a run killed before its first checkpoint leaves its directory
    stopped.mkdir()
    (stopped / UNFINISHED_FILE).touch()
    (stopped / "train_config.json").write_text("{}", encoding="utf-8")
    SummarizerTrainer(tiny_config("mle", backbone=backbone), stopped)  # nothing to keep there: it starts again
    (stopped / UNFINISHED_FILE).unlink()
    with pytest.raises(MedfaqError, match="is not empty; pass --resume"):
        SummarizerTrainer(tiny_config("mle", backbone=backbone), stopped)


def test_bad_input_is_one_clear_error(tiny_bert_dir, tmp_path):
    with pytest.raises(MedfaqError, match="unknown variant"):
        preset_config("quick", "nope")
    with pytest.raises(MedfaqError, match="unknown preset"):
        preset_config("slow", "ecl")
    with pytest.raises(MedfaqError, match="n_frame_negatives must be a whole number of at least 0"):
        preset_config("quick", "ecl", n_frame_negatives=-1)
    with pytest.raises(MedfaqError, match="nothing to resume"):
        SummarizerTrainer(tiny_config("mle", backbone=str(tiny_bert_dir)), tmp_path / "empty", resume=True)
    with pytest.raises(MedfaqError, match="not a trained summarizer"):
        Summarizer.load(tiny_bert_dir)


def test_pretraining_stage_runs_before_the_main_data(tiny_bert_dir, tmp_path):
    config = tiny_config("mle", backbone=str(tiny_bert_dir), pretrain=["extra:train"], pretrain_examples=2)
    history = train_summarizer(config, PAIRS[:2], PAIRS[4:], tmp_path / "run", pretrain_pairs=PAIRS[2:])
    assert [(h["stage"], h["step"]) for h in history] == [("pretrain", 1), ("main", 2)]
    assert history[-1]["best"] and "best" not in history[0]
