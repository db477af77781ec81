"""The summarizer on a tiny random decoder-only LM (Gemma 3 and Llama configs): loss mask, anchors, every variant
trains, saves, resumes, reloads and generates; QFCL's loss weights; the learned negatives' gradient separation."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from medfaq.common.runtime import MedfaqError
from medfaq.summarizer.decoding import Decoding
from medfaq.summarizer.generation import ContextGuidance, Summarizer
from medfaq.summarizer.modeling import SEPARATOR, backbone_is_causal, load_backbone
from medfaq.summarizer.training.config import CONFIG_FILE, VARIANTS
from medfaq.summarizer.training.examples import Example
from medfaq.summarizer.training.trainer import LAST_DIR, SummarizerTrainer, train_summarizer
from tests.conftest import SUMMARY_PAIRS as PAIRS
from tests.conftest import tiny_summarizer_config


def _save_causal(out, model_config, minilm_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir))
    tokenizer.eos_token = tokenizer.sep_token  # the word-piece tokenizer has no EOS or BOS of its own
    tokenizer.bos_token = tokenizer.cls_token
    AutoModelForCausalLM.from_config(model_config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _tiny_sizes(tokenizer_vocab: int) -> dict:
    return dict(
        vocab_size=tokenizer_vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
    )


@pytest.fixture(scope="module")
def tiny_gemma_dir(tmp_path_factory, minilm_dir):
    """A 2-layer, 32-wide Gemma 3 text model with random weights and MiniLM's tokenizer."""
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(
        **_tiny_sizes(30522), sliding_window=16, layer_types=["sliding_attention", "full_attention"]
    )
    return _save_causal(tmp_path_factory.mktemp("tiny_gemma"), config, minilm_dir)


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory, minilm_dir):
    from transformers import LlamaConfig

    return _save_causal(tmp_path_factory.mktemp("tiny_llama"), LlamaConfig(**_tiny_sizes(30522)), minilm_dir)


def tiny_config(variant: str, backbone, **overrides):
    return tiny_summarizer_config(variant, backbone=str(backbone), **overrides)


def test_causal_backbones_are_recognised(tiny_gemma_dir, tiny_llama_dir, tiny_bert_dir):
    assert backbone_is_causal(tiny_gemma_dir) and backbone_is_causal(tiny_llama_dir)
    assert not backbone_is_causal(tiny_bert_dir)
    model, tokenizer = load_backbone(tiny_gemma_dir)
    assert tokenizer.padding_side == "left" and model.generation_config.eos_token_id == tokenizer.sep_token_id


def test_loss_mask_covers_only_the_target_and_the_anchor_only_the_question(tiny_gemma_dir, tmp_path):
    trainer = SummarizerTrainer(tiny_config("ecl", tiny_gemma_dir), tmp_path / "run")
    tokenizer = trainer.tokenizer
    examples = [Example(i, c, f, (f"not {f}",)) for i, (c, f) in enumerate(PAIRS[:3])]
    batch = trainer.collator(examples)
    for row, example in enumerate(examples):
        ids = batch.source["input_ids"][row][batch.source["attention_mask"][row].bool()].tolist()
        labels = batch.labels[row][: len(ids)].tolist()
        target = [t for t in labels if t != -100]
        start = labels.index(target[0])
        assert all(t == -100 for t in labels[:start]) and labels[start:] == ids[start:]
        assert target[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(target, skip_special_tokens=True) == tokenizer.decode(
            tokenizer(example.faq, add_special_tokens=False)["input_ids"]
        )
        assert tokenizer.decode(ids[:start], skip_special_tokens=True).endswith(
            tokenizer.decode(tokenizer(SEPARATOR, add_special_tokens=False)["input_ids"])
        )
        anchor = [t for t, m in zip(ids, batch.anchor_mask[row].tolist(), strict=False) if m]
        assert tokenizer.decode(anchor) == tokenizer.decode(
            tokenizer(example.chq, add_special_tokens=False)["input_ids"]
        )
        assert (batch.labels[row][len(ids) :] == -100).all()  # padding is never a target


def test_target_only_cross_entropy_equals_the_full_model_loss(tiny_gemma_dir, tmp_path):
    config = tiny_config("mle", tiny_gemma_dir, label_smoothing=0.0)
    trainer = SummarizerTrainer(config, tmp_path / "run")
    trainer.model.eval()
    batch = trainer.collator([Example(i, c, f) for i, (c, f) in enumerate(PAIRS[:3])])
    ce, _, _ = trainer._forward(batch)
    mask = batch.source["attention_mask"]
    reference = trainer.model(
        input_ids=batch.source["input_ids"], attention_mask=mask, labels=batch.labels
    ).loss  # logits at every position, the stock shifted loss
    assert torch.allclose(ce, reference, atol=1e-5)


def test_embedding_frozen_and_shared_with_the_key_encoder(tiny_gemma_dir, tmp_path):
    trainer = SummarizerTrainer(tiny_config("ecl", tiny_gemma_dir), tmp_path / "run")
    trainer.train(PAIRS[:2], PAIRS[4:5])
    embedding = trainer.model.get_input_embeddings().weight
    assert not embedding.requires_grad
    key_embedding = trainer.moco.key_encoder.get_input_embeddings().weight
    assert key_embedding is embedding  # shared, not copied
    query_layer = next(trainer.encoder.layers.parameters())
    key_layer = next(trainer.moco.key_encoder.layers.parameters())
    assert key_layer is not query_layer and not key_layer.requires_grad


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_trains_resumes_reloads_and_generates(variant, tiny_gemma_dir, tmp_path):
    out = tmp_path / variant
    config = tiny_config(variant, tiny_gemma_dir, epochs=2)
    first = train_summarizer(tiny_config(variant, tiny_gemma_dir, epochs=2, max_steps=1), PAIRS[:4], PAIRS[4:], out)
    assert first == [] and (out / LAST_DIR / "trainer_state.pt").is_file()
    history = train_summarizer(config, PAIRS[:4], PAIRS[4:], out, resume=True)
    assert [h["step"] for h in history] == [2, 4]
    record = history[-1]
    assert all(torch.isfinite(torch.tensor(v)) for k, v in record.items() if k.startswith("train_"))
    if variant in {"ecl", "ecl-s", "qfcl"}:
        assert "train_hcl" in record and "train_cos_hard" in record
    if variant == "qfcl":
        assert "train_scl_dec" in record and "train_hcl_dec" in record
    if variant == "learned":
        assert "train_lcl" in record and "train_diversity" in record
    if variant == "rank":
        assert "train_rank" in record and not any(key.startswith("train_cos") for key in record)
    assert json.loads((out / CONFIG_FILE).read_text())["variant"] == variant
    summarizer = Summarizer.load(out)
    summaries = summarizer.summarize([PAIRS[0][0], PAIRS[1][0], "short"], Decoding(max_length=5), batch_size=2)
    assert len(summaries) == 3 and all(isinstance(s, str) for s in summaries)
    alone = summarizer.summarize([PAIRS[1][0]], Decoding(max_length=5))
    assert alone[0] == summaries[1]  # left padding in a batch changes nothing


def test_any_causal_lm_id_or_path_works(tiny_llama_dir, tmp_path):
    out = tmp_path / "llama"
    train_summarizer(tiny_config("ecl", tiny_llama_dir), PAIRS[:4], PAIRS[4:], out)
    int8 = Summarizer.load(out, quantize=True)  # decoder-only int8: CTranslate2, converted once beside the model
    assert int8.fast is not None and (out / "ct2-int8" / "model.bin").is_file()
    short = Decoding(max_length=4)
    summaries = int8.summarize([PAIRS[0][0], "short"], short)
    assert len(summaries) == 2 and all(isinstance(s, str) for s in summaries)
    torch_int8 = Summarizer.load(out, quantize=True, int8_backend="torch")  # PyTorch dynamic quantisation instead
    assert torch_int8.fast is None and len(torch_int8.summarize([PAIRS[0][0]], short)) == 1
    with pytest.raises(MedfaqError, match="unknown int8 backend 'onnx'"):
        Summarizer.load(out, quantize=True, int8_backend="onnx")
    from experiments.summarizer_speed import ct2_generator

    generate, generate_batch = ct2_generator(str(out), 4, int8.max_source_len, threads=1)
    text, new_tokens = generate(PAIRS[0][0])
    assert text == summaries[0] and 0 <= new_tokens <= 4
    assert generate_batch([PAIRS[0][0], "short"]) == summaries
    for summarizer in (int8, Summarizer.load(out)):
        texts = [PAIRS[0][0], PAIRS[1][0], "short"]
        beams = summarizer.candidates(texts, Decoding(max_length=4, mbr=3), batch_size=2)
        assert [len(found) for found in beams] == [3, 3, 3]
        best = summarizer.summarize(texts, Decoding(num_beams=3, max_length=4), batch_size=2)
        assert [found[0] for found in beams] == best
        chosen = summarizer.summarize(texts, Decoding(max_length=4, mbr=3), batch_size=2)
        assert all(choice in found for choice, found in zip(chosen, beams, strict=True))
        with pytest.raises(MedfaqError, match="at least 1"):
            summarizer.candidates(texts, short, batch_size=0)
    assert_length_penalty_reaches_the_search(int8, int8.fast, "generator", "generate_batch")  # CTranslate2
    fp32 = Summarizer.load(out)
    assert_length_penalty_reaches_the_search(fp32, fp32, "model", "generate")  # transformers


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"num_beams": 0}, "at least 1"),
        ({"mbr": 0}, "at least 1"),
        ({"max_length": 0}, "at least 1"),
        ({"length_penalty": float("nan")}, "length penalty must be a finite number"),
        ({"guidance": -0.1}, "guidance weight must be a finite number of at least 0"),
        ({"guidance": float("inf")}, "guidance weight must be a finite number of at least 0"),
    ],
)
def test_decoding_settings_refuse_impossible_values(settings, message):
    with pytest.raises(MedfaqError, match=message):
        Decoding(**settings)


def test_decoding_beam_width_covers_the_beams_returned():
    assert Decoding().width == 1 and Decoding(num_beams=4).width == 4 and Decoding(num_beams=2, mbr=8).width == 8


def assert_length_penalty_reaches_the_search(summarizer: Summarizer, holder, attribute: str, method: str) -> None:
    """`length_penalty` reaches the beam search (`holder.attribute.method`) unchanged, 1.0 by default."""
    searcher = getattr(holder, attribute)
    search, penalties = getattr(searcher, method), []

    def spy(*args, **kwargs):
        penalties.append(kwargs["length_penalty"])
        return search(*args, **kwargs)

    spying = type("Spying", (), {method: staticmethod(spy), "__getattr__": lambda _, name: getattr(searcher, name)})
    setattr(holder, attribute, spying())
    texts = [PAIRS[0][0], PAIRS[1][0]]
    summarizer.summarize(texts, Decoding(num_beams=3, max_length=4, length_penalty=2.5))
    summarizer.summarize(texts, Decoding(num_beams=3, max_length=4))
    assert penalties == [2.5, 1.0]


def test_qfcl_weights_follow_the_paper(tiny_gemma_dir, tmp_path):
    trainer = SummarizerTrainer(tiny_config("qfcl", tiny_gemma_dir), tmp_path / "run")
    assert (trainer.config.alpha, trainer.config.beta) == (1.0, 0.5)
    trainer.build_moco(8, 4)
    examples = [Example(i, c, f, (f"not {f}", f"{f} no")) for i, (c, f) in enumerate(PAIRS[:3])]
    trainer.moco.queue.enqueue(torch.nn.functional.normalize(torch.randn(4, 32), dim=-1), torch.tensor([9] * 4))
    total, parts, _ = trainer.losses(trainer.collator(examples))
    expected = (
        parts["ce"] + 0.5 * (parts["scl"] + 0.5 * parts["hcl"]) + 0.5 * (parts["scl_dec"] + 0.5 * parts["hcl_dec"])
    )
    assert parts["loss"] == pytest.approx(expected, rel=1e-5)
    assert float(total.detach()) == pytest.approx(expected, rel=1e-5)


def test_learned_negatives_gradients_are_separated(tiny_gemma_dir, tmp_path):
    config = tiny_config("learned", tiny_gemma_dir, diversity_weight=0.0, alpha=0.0)  # no queue term: L_ce + β·L_lcl
    trainer = SummarizerTrainer(config, tmp_path / "run")
    trainer.build_moco(8, 4)
    assert trainer.config.learned_temperature == 1.0
    batch = trainer.collator([Example(i, c, f) for i, (c, f) in enumerate(PAIRS[:3])])
    torch.manual_seed(1)
    total, parts, _ = trainer.losses(batch)
    assert parts["loss"] == pytest.approx(parts["ce"] + trainer.config.beta * parts["lcl"], rel=1e-5)
    assert float(total.detach()) == pytest.approx(parts["ce"], abs=1e-4)  # the adversary's term cancels L_lcl's value
    generator = list(trainer.moco.generator.parameters())
    model = [p for p in trainer.model.parameters() if p.requires_grad]
    total.backward()
    generator_grads = [p.grad.clone() for p in generator]
    assert any(g.abs().sum() > 0 for g in generator_grads)
    trainer.model.zero_grad()
    trainer.moco.generator.zero_grad()
    trainer.config.beta = 0.0  # without L_lcl: the model must see L_ce only, the generator still the adversary only
    torch.manual_seed(1)
    total, _, _ = trainer.losses(batch)
    total.backward()
    for before, param in zip(generator_grads, generator, strict=True):
        assert torch.allclose(before, param.grad, atol=1e-6)
    with_adversary = [p.grad.clone() for p in model]
    trainer.model.zero_grad()
    trainer._forward(batch)[0].backward()
    for grad, param in zip(with_adversary, model, strict=True):
        assert torch.allclose(grad, param.grad, atol=1e-6)


def test_speed_benchmark_measures_fp32_and_int8(tiny_gemma_dir):
    from experiments.summarizer_speed import latency, throughput, torch_generator

    texts = [chq for chq, _ in PAIRS[:3]]
    for quantize in (False, True):
        generate, generate_batch = torch_generator(str(tiny_gemma_dir), quantize, max_new_tokens=3, max_source_len=16)
        row = latency(generate, texts[:2])
        assert row["questions"] == 2 and 0 < row["p50_ms"] <= row["p90_ms"] and 0 < row["mean_new_tokens"] <= 3
        batches = []
        speed = throughput(lambda batch: batches.append(batch) or generate_batch(batch), texts, batch_size=2)
        assert speed["questions_per_s"] > 0 and speed["batch_size"] == 2
        assert [len(batch) for batch in batches] == [2, 2, 1]  # one warm-up batch, then every question once
        assert sorted(batches[1] + batches[2]) == sorted(texts)
        assert all(isinstance(summary, str) for summary in generate_batch(texts))


def test_lora_trains_adapters_only_resumes_and_saves_a_merged_model(tiny_gemma_dir, tmp_path):
    out = tmp_path / "lora"
    first = train_summarizer(
        tiny_config("ecl", tiny_gemma_dir, epochs=2, lora_rank=4, max_steps=1), PAIRS[:4], PAIRS[4:], out
    )
    assert first == [] and (out / LAST_DIR / "adapter_model.safetensors").is_file()
    trainer = SummarizerTrainer(tiny_config("ecl", tiny_gemma_dir, epochs=2, lora_rank=4), out, resume=True)
    trainable = {name for name, param in trainer.model.named_parameters() if param.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    resumed = trainer.train(PAIRS[:4], PAIRS[4:])
    assert [h["step"] for h in resumed] == [2, 4]
    query, key = dict(trainer.encoder.named_parameters()), dict(trainer.moco.key_encoder.named_parameters())
    assert all((key[name] is param) != param.requires_grad for name, param in query.items())  # adapters copied
    base, _ = load_backbone(tiny_gemma_dir)
    merged, _ = load_backbone(out)  # a plain model: every loader reads it
    assert not any("lora" in name for name in merged.state_dict())
    changed = [name for name, weight in merged.state_dict().items() if not torch.equal(weight, base.state_dict()[name])]
    assert changed and all("proj" in name for name in changed)  # adapters of linear layers; embedding untouched
    summaries = Summarizer.load(out).summarize([PAIRS[0][0]], Decoding(max_length=5))
    assert len(summaries) == 1


def test_lora_needs_a_decoder_only_backbone(tiny_bert_dir, tmp_path):
    with pytest.raises(Exception, match="decoder-only"):
        SummarizerTrainer(tiny_config("mle", tiny_bert_dir, lora_rank=4), tmp_path / "run")


def test_average_of_seeds_is_the_parameter_mean_and_generates(tiny_gemma_dir, tiny_bert_dir, tmp_path):
    from medfaq.summarizer.training.averaging import average_summarizers

    runs = [tmp_path / f"seed{seed}" for seed in (0, 1)]
    for seed, run in enumerate(runs):
        config = tiny_config("mle", tiny_gemma_dir, seed=seed, batch_size=1, threads=1)  # the seed orders 4 batches
        train_summarizer(config, PAIRS[:4], PAIRS[4:], run)
    out = average_summarizers(runs, tmp_path / "soup")
    weights = [load_backbone(run)[0].state_dict() for run in runs]
    averaged = load_backbone(out)[0].state_dict()
    assert any(not torch.equal(weights[0][name], weights[1][name]) for name in averaged)  # the seeds differ
    assert all(torch.allclose(averaged[name], (weights[0][name] + weights[1][name]) / 2) for name in averaged)
    assert json.loads((out / CONFIG_FILE).read_text())["averaged_from"] == [str(run) for run in runs]
    assert len(Summarizer.load(out).summarize([PAIRS[0][0]], Decoding(max_length=4))) == 1

    train_summarizer(tiny_config("ecl", tiny_gemma_dir, threads=1), PAIRS[:4], PAIRS[4:], tmp_path / "ecl")
    with pytest.raises(MedfaqError, match="differ in .*variant"):
        average_summarizers([runs[0], tmp_path / "ecl"], tmp_path / "mixed")
    with pytest.raises(MedfaqError, match="not an empty directory"):
        average_summarizers(runs, out)
    for run in runs:  # each run saves its own copy of the same mined rows
        (run / "mined.jsonl").write_text('{"chq": "a", "negatives": ["b"]}\n', encoding="utf-8")
        config = json.loads((run / CONFIG_FILE).read_text())
        (run / CONFIG_FILE).write_text(json.dumps({**config, "retrieval_negatives": str(run / "mined.jsonl")}))
    assert (average_summarizers(runs, tmp_path / "rank-soup") / CONFIG_FILE).is_file()
    (runs[1] / "mined.jsonl").write_text('{"chq": "a", "negatives": ["c"]}\n', encoding="utf-8")
    with pytest.raises(MedfaqError, match="differ in retrieval_negatives"):
        average_summarizers(runs, tmp_path / "other-negatives")
    not_summarizer = tmp_path / "reranker"
    not_summarizer.mkdir()
    (not_summarizer / CONFIG_FILE).write_text(json.dumps({"model_type": "crossencoder"}))
    with pytest.raises(MedfaqError, match="is a cross-encoder, not a summarizer"):
        average_summarizers([runs[0], not_summarizer], tmp_path / "other-kind")
    bert_runs = [tmp_path / f"bert{seed}" for seed in (0, 1)]
    for seed, run in enumerate(bert_runs):
        train_summarizer(tiny_config("mle", tiny_bert_dir, seed=seed, threads=1), PAIRS[:4], PAIRS[4:], run)
    with pytest.raises(MedfaqError, match="cross-attention"):
        average_summarizers(bert_runs, tmp_path / "bert-soup")


class ScriptedDecoder:
    """An ONNX-decoder-shaped session whose greedy choice for each row is the next id of a fixed script; it records
    the lengths of the mask and cache it was given."""

    def __init__(self, scripts: list[list[int]], vocab: int = 10):
        self.scripts, self.vocab, self.step, self.seen = scripts, vocab, 0, []
        self.inputs = [
            SimpleNamespace(name=f"past_key_values.0.{kind}", shape=["b", 1, "p", 2]) for kind in ("key", "value")
        ]

    def get_inputs(self):
        return [SimpleNamespace(name="input_ids"), SimpleNamespace(name="attention_mask"), *self.inputs]

    def get_outputs(self):
        return [SimpleNamespace(name=name) for name in ("logits", "present.0.key", "present.0.value")]

    def run(self, names, feed):
        ids, mask, past = feed["input_ids"], feed["attention_mask"], feed["past_key_values.0.key"]
        self.seen.append((mask.shape[1], past.shape[2], ids.shape[1]))
        logits = np.zeros((ids.shape[0], ids.shape[1], self.vocab), np.float32)
        for row, script in enumerate(self.scripts):
            logits[row, -1, script[min(self.step, len(script) - 1)]] = 1.0
        self.step += 1
        present = np.concatenate([past, np.zeros((ids.shape[0], 1, ids.shape[1], 2), np.float32)], axis=2)
        return [logits, present, present.copy()]


def test_onnx_greedy_decoding_feeds_the_cache_back_and_stops_each_row_at_its_stop_id():
    from experiments.summarizer_speed import greedy_with_cache

    session = ScriptedDecoder([[5, 6, 1, 7], [4, 1, 8, 8]])
    prompt, mask = np.array([[3, 3, 3], [0, 3, 3]]), np.array([[1, 1, 1], [0, 1, 1]])
    assert greedy_with_cache(session, prompt, mask, max_new_tokens=8, stop_ids={1}) == [[5, 6], [4]]
    assert session.seen == [(3, 0, 3), (4, 3, 1), (5, 4, 1)]  # the prompt once, then one new id on the grown cache
    capped = greedy_with_cache(ScriptedDecoder([[5, 6, 7, 8]]), prompt[:1], mask[:1], max_new_tokens=2, stop_ids={1})
    assert capped == [[5, 6]]


def test_context_guidance_follows_the_beams_and_equals_a_full_recomputation(tiny_gemma_dir, tiny_bert_dir, monkeypatch):
    import medfaq.summarizer.generation as generation

    checked_steps = []

    class Recomputed(ContextGuidance):
        """Checks each step's scores against the context-free model run on the whole prefix without a cache."""

        def __call__(self, input_ids, scores):
            guided = super().__call__(input_ids, scores)
            generated = input_ids[:, self.prompt_width :]
            prefix = torch.cat([self.empty_prompt.expand(len(generated), -1), generated], dim=1)
            context_free = torch.log_softmax(self.model(input_ids=prefix).logits[:, -1].float(), dim=-1)
            conditional = torch.log_softmax(scores.float(), dim=-1)
            expected = conditional + self.weight * (conditional - context_free)
            implausible = conditional < conditional.max(dim=-1, keepdim=True).values + math.log(generation.PLAUSIBILITY)
            torch.testing.assert_close(guided, expected.masked_fill(implausible, -math.inf))
            checked_steps.append(len(generated[0]))
            return guided

    monkeypatch.setattr(generation, "ContextGuidance", Recomputed)
    model, tokenizer = load_backbone(tiny_gemma_dir)
    texts = [chq for chq, _ in PAIRS[:3]]
    plain = generation.generate_candidates(model.eval(), tokenizer, texts, Decoding(3, 5), progress=False)
    guided = generation.generate_candidates(model, tokenizer, texts, Decoding(3, 5, guidance=1.0), progress=False)
    assert len(guided) == 3 and all(len(beams) == 1 for beams in guided)
    assert checked_steps[:2] == [0, 1] and max(checked_steps) >= 3  # every step of the search was checked
    assert guided != plain  # with random weights, dividing by the context-free model changes the search
    scores = torch.zeros(2, model.config.vocab_size)
    scores[:, 7], scores[:, 8] = 10.0, 9.0  # only tokens 7 and 8 are plausible given the CHQ
    guide = ContextGuidance(model, [tokenizer.cls_token_id], 3, 2.0)
    kept = guide(torch.zeros(2, 3, dtype=torch.long), scores).isfinite()
    assert kept[:, [7, 8]].all() and kept.sum() == 4
    first_token_only = ContextGuidance(model, [tokenizer.cls_token_id], 3, 2.0, tokens=1)
    after_it = first_token_only(torch.zeros(2, 4, dtype=torch.long), scores)  # one token generated already
    torch.testing.assert_close(after_it, torch.log_softmax(scores, dim=-1))
    assert first_token_only.cache is None  # the context-free model never ran
    bert, bert_tokenizer = load_backbone(tiny_bert_dir)  # an encoder-decoder warm-started from BERT
    with pytest.raises(MedfaqError, match="decoder-only"):
        generation.generate_candidates(bert, bert_tokenizer, texts, Decoding(guidance=0.5), progress=False)
