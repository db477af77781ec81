"""The summarizer as a ranker (summarizer/likelihood.py) on tiny random models, and its pipeline stage: shared-prefix
scores equal one full forward pass per candidate, the prior correction, the RRF fusion, the gate, and the switch
through the CLI, the HTTP API and pipeline.json."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from medfaq.common.runtime import MedfaqError
from medfaq.index.faq_index import FaqIndex
from medfaq.retriever.pipeline import Pipeline, PipelineConfig
from medfaq.retriever.pipeline_file import write_config
from medfaq.summarizer.likelihood import SummaryLikelihood, TokenScores, combine
from medfaq.summarizer.modeling import load_backbone, prompt_ids
from tests.test_summarizer_causal import _save_causal, _tiny_sizes

QUESTION = "i take ibuprofen every day for my back, can it hurt my stomach? my doctor is away this week"
CANDIDATES = [
    "Can ibuprofen cause stomach ulcers?",
    "What are the treatments for back pain?",
    "What is ibuprofen?",
    "How is shingles treated?",
]


def _as_summarizer(directory, max_source_len=48, max_target_len=16):
    (directory / "train_config.json").write_text(
        json.dumps({"max_source_len": max_source_len, "max_target_len": max_target_len}), encoding="utf-8"
    )
    return directory


@pytest.fixture(scope="module")
def tiny_gemma_summarizer(tmp_path_factory, minilm_dir):
    """A tiny random Gemma 3 whose sliding window (8) is shorter than the prompt, saved as a trained summarizer."""
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(
        **_tiny_sizes(30522), sliding_window=8, layer_types=["sliding_attention", "full_attention"]
    )
    return _as_summarizer(_save_causal(tmp_path_factory.mktemp("gemma_summarizer"), config, minilm_dir))


@pytest.fixture(scope="module")
def tiny_llama_summarizer(tmp_path_factory, minilm_dir):
    """A tiny random Llama (one kind of layer, no sliding window), saved as a trained summarizer."""
    from transformers import LlamaConfig

    return _as_summarizer(
        _save_causal(tmp_path_factory.mktemp("llama_summarizer"), LlamaConfig(**_tiny_sizes(30522)), minilm_dir)
    )


@pytest.fixture(scope="module")
def tiny_mistral_summarizer(tmp_path_factory, minilm_dir):
    """A tiny random Mistral: one kind of layer, every one sliding, its window (8) shorter than the prompt."""
    from transformers import MistralConfig

    config = MistralConfig(**_tiny_sizes(30522), sliding_window=8)
    return _as_summarizer(_save_causal(tmp_path_factory.mktemp("mistral_summarizer"), config, minilm_dir))


@pytest.fixture(scope="module")
def tiny_bert2bert_summarizer(tmp_path_factory, tiny_bert_dir):
    """A BERT2BERT encoder-decoder warm-started from the tiny BERT, saved as a trained summarizer."""
    torch.manual_seed(0)
    model, tokenizer = load_backbone(tiny_bert_dir)
    out = tmp_path_factory.mktemp("bert2bert_summarizer")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return _as_summarizer(out)


def unshared_log_probs(scorer: SummaryLikelihood, question: str, candidates: list[str]) -> np.ndarray:
    """Each candidate's summed log-probability from its own full forward pass (no cache, no batch), over the full
    vocabulary, or over a trimmed stage's kept tokens: the full softmax restricted to them and renormalised."""
    totals = []
    for text in candidates:
        target = scorer._target_ids(text)
        with torch.inference_mode():
            if scorer.causal:
                prompt = prompt_ids(scorer.tokenizer, question, scorer.max_source_len)[0]
                logits = scorer.model(input_ids=torch.tensor([prompt + target])).logits[0, len(prompt) - 1 : -1]
            else:
                encoded = scorer.tokenizer(
                    question, max_length=scorer.max_source_len, truncation=True, return_tensors="pt"
                )
                logits = scorer.model(**encoded, labels=torch.tensor([target])).logits[0]
        if scorer.trims:
            kept = scorer._vocabulary.kept
            logits, target = logits[:, kept], scorer._vocabulary.to_kept(torch.tensor(target)).tolist()
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        totals.append(float(sum(log_probs[i, token] for i, token in enumerate(target))))
    return np.array(totals)


@pytest.mark.parametrize(
    ("backbone", "vocabulary"),
    [
        ("tiny_gemma_summarizer", "full"),
        ("tiny_gemma_summarizer", "bank"),
        ("tiny_llama_summarizer", "full"),
        ("tiny_mistral_summarizer", "full"),
        ("tiny_bert2bert_summarizer", "bank"),
    ],
)
def test_shared_prefix_scores_equal_one_forward_pass_per_candidate(backbone, vocabulary, request):
    scorer = SummaryLikelihood.load(request.getfixturevalue(backbone), vocabulary=vocabulary)
    assert scorer.causal == (backbone != "tiny_bert2bert_summarizer")
    assert scorer.trims == (scorer.causal and vocabulary == "bank")
    scorer.keep(["How is acne treated?", *CANDIDATES])
    shared = scorer.token_scores(QUESTION, CANDIDATES)
    np.testing.assert_allclose(shared.log_prob, unshared_log_probs(scorer, QUESTION, CANDIDATES), rtol=1e-4, atol=1e-4)
    assert shared.tokens.tolist() == [len(scorer._target_ids(text)) for text in CANDIDATES]
    assert (shared.log_prob < 0).all()
    alone = scorer.token_scores(QUESTION, CANDIDATES[2:3])  # padding beside a longer candidate changes nothing
    np.testing.assert_allclose(alone.log_prob, shared.log_prob[2:3], rtol=1e-4, atol=1e-4)


def test_a_model_that_ignores_the_packed_attention_mask_is_refused(tiny_gemma_summarizer):
    from medfaq.summarizer.likelihood import check_packed_scoring

    model, _ = load_backbone(tiny_gemma_summarizer)
    check_packed_scoring(model)  # honours it: no error
    forward = model.forward
    model.forward = lambda **inputs: forward(**{k: v for k, v in inputs.items() if k != "attention_mask"})
    with pytest.raises(MedfaqError, match="packed attention mask"):
        check_packed_scoring(model)


def test_a_trimmed_stage_keeps_its_banks_tokens_once_and_a_new_token_renews_the_priors(tiny_gemma_summarizer):
    scorer = SummaryLikelihood.load(tiny_gemma_summarizer)
    scorer.keep_bank("faqs@1", lambda: CANDIDATES)
    kept = len(scorer._vocabulary)
    assert kept < scorer.model.config.vocab_size
    first = scorer.score(QUESTION, CANDIDATES[:2], prior_weight=1.0)
    assert scorer.score(QUESTION, CANDIDATES[:2], prior_weight=1.0) == first  # a fixed kept set: the same scores
    scorer.keep_bank("faqs@1", lambda: pytest.fail("a bank kept already is read again"))  # nothing changes
    assert len(scorer._vocabulary) == kept and set(scorer._priors) == set(CANDIDATES[:2])
    scorer.score(QUESTION, ["Is zoster contagious?"], prior_weight=1.0)  # its new tokens are kept first
    assert len(scorer._vocabulary) > kept and set(scorer._priors) == {"Is zoster contagious?"}


def test_bf16_scores_in_bf16_and_takes_its_log_probabilities_in_fp32(tiny_gemma_summarizer):
    exact = SummaryLikelihood.load(tiny_gemma_summarizer)
    halved = SummaryLikelihood.load(tiny_gemma_summarizer, precision="bf16")
    assert (exact.precision, halved.precision) == ("fp32", "bf16") and halved.model.dtype == torch.bfloat16
    for scorer in (exact, halved):
        scorer.keep(CANDIDATES)
    scores = halved.token_scores(QUESTION, CANDIDATES)
    assert scores.log_prob.dtype == np.float64
    np.testing.assert_allclose(scores.log_prob, exact.token_scores(QUESTION, CANDIDATES).log_prob, rtol=0.05)
    assert SummaryLikelihood.load(tiny_gemma_summarizer, precision="auto").precision in ("fp32", "bf16")


def test_the_prior_correction_subtracts_the_likelihood_given_no_question(tiny_gemma_summarizer):
    scorer = SummaryLikelihood.load(tiny_gemma_summarizer)
    given = scorer.token_scores(QUESTION, CANDIDATES)
    empty = scorer.token_scores("", CANDIDATES)
    for weight in (0.0, 0.5, 1.0):
        summed = scorer.score(QUESTION, CANDIDATES, prior_weight=weight, per_token=False)
        np.testing.assert_allclose(summed, given.log_prob - weight * empty.log_prob, rtol=1e-4, atol=1e-4)
        per_token = scorer.score(QUESTION, CANDIDATES, prior_weight=weight, per_token=True)
        np.testing.assert_allclose(per_token, np.array(summed) / given.tokens, rtol=1e-4, atol=1e-4)
    assert set(scorer._priors) == set(CANDIDATES)  # computed once per text
    assert scorer.score(QUESTION, []) == []
    scores = TokenScores(np.array([-4.0, -9.0]), np.array([2, 3]))
    prior = TokenScores(np.array([-2.0, -8.0]), np.array([2, 3]))
    assert combine(scores, prior, 1.0, per_token=True).tolist() == [-1.0, pytest.approx(-1 / 3)]


class PreferringScorer:
    """A likelihood stage that prefers one FAQ question; records what it was asked."""

    def __init__(self, preferred: str) -> None:
        self.preferred, self.calls = preferred, []

    def score(self, query, candidates, prior_weight, per_token):
        self.calls.append((query, list(candidates), prior_weight, per_token))
        return [0.0 if text == self.preferred else -5.0 - i for i, text in enumerate(candidates)]


@pytest.fixture(scope="module")
def index(tiny_encoder):
    from medfaq.index.records import FaqRecord
    from tests.conftest import FAQ_ROWS

    return FaqIndex.build([FaqRecord.from_dict(row) for row in FAQ_ROWS], tiny_encoder, progress=False)


def test_the_likelihood_ranking_joins_the_reranking_rrf(index):
    question = "treatment of shingles rash"
    retrieved = Pipeline(index, PipelineConfig(top_k=5)).run(question)
    ids = [h.id for h in retrieved.hits]
    k = 60
    # the scorer ranks the fifth hit first, then the others in retrieval order; retrieval weighs 3
    likelihood_rank = {ids[4]: 1, **{doc_id: rank for rank, doc_id in enumerate(ids[:4], 2)}}
    for weight, order in ((1.0, [*ids[:3], ids[4], ids[3]]), (20.0, [ids[4], *ids[:4]])):
        config = PipelineConfig(top_k=5, likelihood=True, likelihood_depth=5, likelihood_weight=weight, rerank_rrf_k=k)
        scorer = PreferringScorer(retrieved.hits[4].question)
        response = Pipeline(index, config, likelihood=scorer).run(question)
        assert scorer.calls == [(question, [h.question for h in retrieved.hits], 1.0, True)]
        assert [h.id for h in response.hits] == order and [h.rank for h in response.hits] == [1, 2, 3, 4, 5]
        for hit in response.hits:
            expected = 3 / (k + ids.index(hit.id) + 1) + weight / (k + likelihood_rank[hit.id])
            assert hit.score == pytest.approx(expected) == hit.stage_scores["likelihood_rrf"]
        assert {h.id: h.stage_scores["likelihood"] for h in response.hits}[ids[4]] == 0.0
        assert response.confidence == response.hits[0].stage_scores["dense"]  # still a cosine: thresholds hold


def test_likelihood_and_reranker_fuse_in_one_rrf(index):
    from tests.test_pipeline_stages import ReverseReranker

    question = "treatment of shingles rash"
    retrieved = [h.id for h in Pipeline(index, PipelineConfig(top_k=5)).run(question).hits]
    config = PipelineConfig(top_k=5, rerank=True, rerank_depth=5, likelihood=True, likelihood_depth=3)
    hits = Pipeline(index, config, reranker=ReverseReranker(), likelihood=PreferringScorer("")).run(question).hits
    scores = {h.id: h.score for h in hits}
    k = config.rerank_rrf_k
    for rank, doc_id in enumerate(retrieved, 1):  # retrieval (3), reversed cross-encoder (1), likelihood (1, top 3)
        expected = 3 / (k + rank) + 1 / (k + 6 - rank) + (1 / (k + rank) if rank <= 3 else 0.0)
        assert scores[doc_id] == pytest.approx(expected)
    assert all("rerank_rrf" in h.stage_scores for h in hits)
    assert ["likelihood" in h.stage_scores for h in hits] == [h.id in retrieved[:3] for h in hits]


def test_the_gate_scores_only_questions_dense_search_is_unsure_of(index):
    question = "treatment of shingles rash"
    retrieved = Pipeline(index, PipelineConfig(top_k=5)).run(question).hits
    margin = retrieved[0].score - retrieved[1].score
    for gate, scored in ((margin / 2, False), (margin * 2, True), (None, True)):
        scorer = PreferringScorer(retrieved[4].question)
        config = PipelineConfig(top_k=5, likelihood=True, likelihood_depth=5, rerank_margin=gate)
        response = Pipeline(index, config, likelihood=scorer).run(question)
        assert len(scorer.calls) == int(scored)
        if not scored:
            assert [(h.id, h.score) for h in response.hits] == [(h.id, h.score) for h in retrieved]
            assert "likelihood" not in response.timings_ms


def test_the_likelihood_settings_are_checked(index):
    from medfaq.common.runtime import MedfaqError

    with pytest.raises(MedfaqError, match="no likelihood stage"):
        Pipeline(index, PipelineConfig(likelihood=True))
    for bad in ({"likelihood_depth": 0}, {"likelihood_weight": 0.0}, {"likelihood_prior": -1.0}):
        with pytest.raises(MedfaqError):
            PipelineConfig(**bad)
    with pytest.raises(MedfaqError, match="finite"):
        PipelineConfig(likelihood_prior=float("nan"))


@pytest.fixture
def summarizer_home(tmp_path, monkeypatch, tiny_gemma_summarizer, index):
    """$MEDFAQ_HOME with the tiny Gemma summarizer as the best trained one, and an index saved under it."""
    import shutil

    monkeypatch.setenv("MEDFAQ_HOME", str(tmp_path / "home"))
    from medfaq.common.runtime import models_dir

    shutil.copytree(tiny_gemma_summarizer, models_dir() / "summarizer-ecl-quick")
    index_dir = tmp_path / "index"
    index.save(index_dir)
    return index_dir


def test_the_stage_switches_through_pipeline_json_the_cli_and_the_api(summarizer_home):
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from medfaq.app.cli import app
    from medfaq.app.server import create_app
    from medfaq.app.service import SearchService
    from medfaq.retriever.model_cache import open_pipeline

    index_dir = summarizer_home
    question = "treatment of shingles rash"
    write_config(index_dir, PipelineConfig(likelihood=True, likelihood_depth=3, abstain=False))
    pipeline = open_pipeline(index_dir)
    assert isinstance(pipeline.likelihood, SummaryLikelihood)
    hits = pipeline.run(question).hits
    assert sum("likelihood" in h.stage_scores for h in hits) == 3

    runner = CliRunner()
    found = runner.invoke(app, ["search", question, "--index", str(index_dir), "--json"])
    assert found.exit_code == 0, found.output
    assert "likelihood" in json.loads(found.output)["hits"][0]["stage_scores"]
    off = runner.invoke(app, ["search", question, "--index", str(index_dir), "--json", "--no-likelihood"])
    assert off.exit_code == 0, off.output
    assert "likelihood" not in json.loads(off.output)["hits"][0]["stage_scores"]

    service = SearchService(index_dir, feedback_path=index_dir.parent / "feedback.sqlite3")
    with TestClient(create_app(service)) as client:
        on = client.post("/search", json={"question": question}).json()
        assert "likelihood" in on["hits"][0]["stage_scores"]
        plain = client.post("/search", json={"question": question, "likelihood": False}).json()
        assert "likelihood" not in plain["hits"][0]["stage_scores"]


def test_the_replay_reorders_stored_hits_as_the_pipeline_does():
    from experiments.summary_ranking import replay_set

    hits = [
        {"id": f"f{i}", "score": 0.9 - i / 100, "rank": i + 1, "question": f"question {i}?", "stage_scores": {}}
        for i in range(4)
    ]
    row = {
        "qid": "q1",
        "text": "a question",
        "hits": hits,
        "given": [-9.0, -9.0, -9.0, -1.0],  # the summarizer prefers the last hit
        "tokens": [3, 3, 3, 3],
        "prior": [-5.0, -5.0, -5.0, -5.0],
    }
    qrels = {"q1": {"f3": 1}}
    dense, dense_firsts = replay_set([row], qrels, None)
    assert dense["recall@1"] == 0.0 and dense_firsts == set()
    changes = {"likelihood_per_token": True, "likelihood_prior": 1.0, "likelihood_weight": 20.0, "rerank_rrf_k": 60}
    moved, firsts = replay_set([row], qrels, changes)
    assert moved["recall@1"] == 100.0 and firsts == {"q1"}
    gated, _ = replay_set([row], qrels, {**changes, "rerank_margin": 0.001})  # top two 0.01 apart: sure
    assert gated["recall@1"] == 0.0


def test_the_beams_rankings_fuse_with_the_raw_ranking_by_weighted_rrf():
    from experiments.summary_queries import replay_set

    row = {
        "qid": "q1",
        "hits": [{"id": doc_id} for doc_id in ("f0", "gold", "f2")],  # the raw question ranks the gold second
        "summaries": ["first beam", "second beam"],
        "summary_hits": [["gold", "f0"], ["gold", "f2"]],  # both beams rank it first
    }
    qrels = {"q1": {"gold": 1}}
    assert replay_set([row], qrels, None)[0]["recall@1"] == 0.0
    one_beam, _ = replay_set([row], qrels, {"summaries": 1, "weight": 0.5, "k": 60})
    assert one_beam["recall@1"] == 0.0  # 1/62 + 0.5/61 < 1/61 + 0.5/62
    two_beams, firsts = replay_set([row], qrels, {"summaries": 2, "weight": 0.5, "k": 60})
    assert two_beams["recall@1"] == 100.0 and firsts == {"q1"}  # 1/62 + 2 x 0.5/61 > 1/61 + 0.5/62


def test_the_development_rule_puts_the_worst_set_first_then_fewest_losses():
    from medfaq.retriever.decisions.stage_choice import choose_on_dev

    outcomes = {  # setting -> per set: (R@1, questions answered at rank 1)
        None: {"a": (50.0, {"1", "2"}), "b": (50.0, {"3"})},
        "helps a, hurts b": {"a": (100.0, {"1", "2", "4", "5"}), "b": (0.0, set())},
        "changes nothing": {"a": (50.0, {"1", "2"}), "b": (50.0, {"3"})},
        "swaps one in a": {"a": (50.0, {"1", "4"}), "b": (50.0, {"3"})},
    }

    def replay_one(rows, qrels, setting):
        r1, firsts = outcomes[setting][rows]
        return {"recall@1": r1, "mrr@10": r1}, firsts

    dev = {"a": ("a", {}), "b": ("b", {})}
    settings = ["helps a, hurts b", "swaps one in a", "changes nothing"]
    candidates, dense = choose_on_dev(dev, replay_one, settings, lambda setting: setting)
    assert [c["setting"] for c in candidates] == ["changes nothing", "swaps one in a", "helps a, hurts b"]
    assert candidates[1]["sets"]["a"] == {"delta_r1": 0.0, "delta_mrr": 0.0, "lost": 1, "gained": 1}
    assert dense["b"]["recall@1"] == 50.0


def test_latency_measures_each_vocabulary_and_precision_against_full_fp32(tiny_gemma_summarizer, index, tmp_path):
    import argparse

    from experiments.summary_ranking import VARIANTS, latency

    index.save(tmp_path / "ix")
    (tmp_path / "q.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": text}) + "\n" for i, text in enumerate([QUESTION] * 5)),
        encoding="utf-8",
    )
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\tf1\t1\n" for i in range(5)))
    args = argparse.Namespace(
        summarizer=str(tiny_gemma_summarizer),
        set="unused",
        benchmarks=tmp_path,
        queries=tmp_path / "q.jsonl",
        qrels=tmp_path / "qrels.tsv",
        index=tmp_path / "ix",
        questions=2,
        threads=1,
        variants=None,
    )
    report = latency(args)
    assert report["questions"] == 2 and [(r["vocabulary"], r["precision"]) for r in report["rows"]] == list(VARIANTS)
    reference, trimmed = report["rows"][0], report["rows"][1]
    assert reference["kendall_tau_top10"] == pytest.approx(1.0) and reference["kept_tokens"] is None
    assert 0 < trimmed["kept_tokens"] < 30522 and -1 <= trimmed["kendall_tau_top10"] <= 1
    assert all(row["n10"]["p50_ms"] > 0 and row["n5"]["gated_end_to_end_p95_ms"] > 0 for row in report["rows"])
    args.variants = "bank/bf16"
    assert [(r["vocabulary"], r["precision"]) for r in latency(args)["rows"]] == [VARIANTS[0], ("bank", "bf16")]
    args.variants = "bank/fp16"
    with pytest.raises(MedfaqError, match="unknown variants"):
        latency(args)
