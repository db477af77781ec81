"""Shared fixtures: tiny randomly initialised models built in memory, and paths to the real data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """Every test gets its own MEDFAQ_HOME so nothing leaks between tests or into the user's home."""
    monkeypatch.setenv("MEDFAQ_HOME", str(tmp_path / "medfaq_home"))


@pytest.fixture(autouse=True)
def _reference_speed(request, monkeypatch):
    """The set-up's times as measured on the reference machine: no test times this machine's speed (a few seconds)
    unless it is marked `speed_probes`."""
    if request.node.get_closest_marker("speed_probes") is None:
        from medfaq.app import setup_speed

        reference = setup_speed.REFERENCE
        monkeypatch.setattr(setup_speed, "measure_speed", lambda: (reference.train, reference.encode))


@pytest.fixture(autouse=True)
def _fresh_stage_cache():
    """Every test loads its own pipeline stages: none that an earlier test cached is reused (or kept in memory)."""
    yield
    from medfaq.retriever.model_cache import shared_cache

    shared_cache().clear()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """`../shared/data`; tests that need it are skipped where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 weights (integration tests only)."""
    from medfaq.common.runtime import minilm_path

    return minilm_path()


def save_tiny_bert(out: Path, minilm_dir: Path, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    """Save into `out` a BERT `hidden` wide with `layers` layers, random weights (`seed`) and MiniLM's tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory, minilm_dir) -> Path:
    """A 2-layer, 32-wide BERT with random weights and MiniLM's tokenizer, saved as a model directory."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), minilm_dir)


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory, tiny_bert_dir) -> Path:
    """A sentence-transformers model (tiny BERT + mean pooling + normalisation) saved as a directory."""
    from sentence_transformers import SentenceTransformer, models

    transformer = models.Transformer(str(tiny_bert_dir), max_seq_length=64)
    pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    model = SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu")
    out = tmp_path_factory.mktemp("tiny_encoder")
    model.save(str(out))
    return out


FAQ_ROWS = [
    {
        "id": "f1",
        "question": "Can I drink alcohol while taking amoxicillin?",
        "answer": "Moderate drinking is usually fine.",
    },
    {"id": "f2", "question": "What are the symptoms of type 2 diabetes?", "answer": "Thirst, frequent urination."},
    {"id": "f3", "question": "How is shingles treated?", "answer": "Antiviral medicines."},
    {"id": "f4", "question": "Is Parkinson's disease inherited?", "answer": "Most cases are not."},
    {"id": "f5", "question": "What causes migraine headaches?", "answer": ""},
    {"id": "f6", "question": "How do vaccines protect against measles?", "answer": "They train the immune system."},
]

CONSUMER_QUESTIONS = [
    ("is it ok to have a beer on antibiotics like amoxicillin", "f1"),
    ("signs of diabetes type two", "f2"),
    ("what helps a shingles rash heal", "f3"),
    ("does parkinsons run in families", "f4"),
    ("why do i get migraines", "f5"),
    ("how does the measles shot work", "f6"),
]
"""Consumer wordings of the FAQ_ROWS questions, with the id of the FAQ that answers each."""
DEVELOPMENT_QUESTIONS = [
    (text + ending, gold)
    for ending in ("", " - any advice?", ", asking for my mum")
    for text, gold in CONSUMER_QUESTIONS
]
"""Three wordings of each consumer question: enough development questions for a stage decision's sign test to
conclude when a stage fixes most of them at rank 1 and breaks none."""


SUMMARY_PAIRS = [
    ("i take ibuprofen every day for my back, can it hurt my stomach? thanks", "Can ibuprofen cause stomach ulcers?"),
    ("my son has asthma and a cold. is albuterol safe for kids?", "Is albuterol safe for children with asthma?"),
    ("does metformin cause weight loss? i have diabetes since 2010", "Does metformin cause weight loss?"),
    ("where can i find trials for leukemia in texas", "Where can I find clinical trials for leukemia?"),
    ("what is the dose of amoxicillin for an ear infection in adults", "What is the dose of amoxicillin?"),
    ("is migraine inherited? my mother and sister both have it", "Is migraine inherited?"),
]
"""(consumer question, FAQ-style summary) pairs for the summarizer tests."""


def tiny_summarizer_config(variant: str, **overrides):
    """A quick-preset summarizer config small enough to train in seconds on CPU."""
    from medfaq.summarizer.training.config import preset_config

    values = dict(
        epochs=1,
        batch_size=2,
        max_source_len=24,
        max_target_len=12,
        eval_max_length=6,
        n_hard_negatives=2,
        n_learned_negatives=2,
        lr=1e-3,
        device="cpu",
    )
    return preset_config("quick", variant, **{**values, **overrides})


@pytest.fixture(scope="session")
def tiny_encoder(tiny_encoder_dir):
    """An `index.encoder.Encoder` over the tiny random sentence-transformers model."""
    from medfaq.index.encoder import Encoder

    return Encoder(str(tiny_encoder_dir), device="cpu")


@pytest.fixture
def faq_jsonl(tmp_path) -> Path:
    """A generic-format FAQ collection of six FAQs."""
    import json

    path = tmp_path / "faqs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in FAQ_ROWS), encoding="utf-8")
    return path


@pytest.fixture
def faq_records():
    from medfaq.index.records import FaqRecord

    return [FaqRecord.from_dict(row) for row in FAQ_ROWS]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """`rows` as a JSONL file at `path`."""
    import json

    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def built_index(tmp_path_factory, tiny_encoder_dir) -> Path:
    """The six test FAQs (``faqs.jsonl`` beside it) indexed once by `medfaq index build` with the tiny encoder;
    tests work on copies (`index_dir`)."""
    from typer.testing import CliRunner

    from medfaq.app.cli import app

    root = tmp_path_factory.mktemp("built")
    faqs = write_jsonl(root / "faqs.jsonl", FAQ_ROWS)
    command = ["index", "build", str(faqs), "--out", str(root / "idx"), "--encoder", str(tiny_encoder_dir)]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    return root / "idx"


@pytest.fixture
def index_dir(tmp_path, built_index) -> Path:
    """A fresh copy of `built_index` for one test."""
    import shutil

    return Path(shutil.copytree(built_index, tmp_path / "idx"))


def assert_decision_kept_and_shown(directory: Path, record_file: str, *shown: str) -> None:
    """A per-index stage decision recorded on (`record_file` beside the index) survives an index save, and
    `medfaq index info` shows every text of `shown`."""
    import json

    from typer.testing import CliRunner

    from medfaq.app.cli import app
    from medfaq.index.faq_index import FaqIndex

    FaqIndex.load(directory).save(directory)
    assert json.loads((directory / record_file).read_text())["on"]
    result = CliRunner().invoke(app, ["index", "info", str(directory)])
    assert result.exit_code == 0 and all(text in result.output for text in shown), result.output


class CountingEncoder:
    """Wraps an encoder; counts encode calls and raises after `fail_after` calls (a simulated kill)."""

    def __init__(self, encoder, fail_after: int | None = None) -> None:
        self.inner, self.fail_after, self.calls = encoder, fail_after, 0
        self.name, self.dim, self.device, self.fingerprint = (
            encoder.name,
            encoder.dim,
            encoder.device,
            encoder.fingerprint,
        )

    def encode(self, texts: list[str]):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt
        self.calls += 1
        return self.inner.encode(texts)


def assert_same_rankings(first, second) -> None:
    """Two searches' results: the same FAQs in the same order, with the same scores."""
    import numpy as np

    assert [[faq_id for faq_id, _ in row] for row in first] == [[faq_id for faq_id, _ in row] for row in second]
    assert np.allclose([[score for _, score in row] for row in first], [[score for _, score in row] for row in second])


GOUT_CHQ = "My father has gout in his big toe since Monday and the pain is awful at night. What treatment helps him?"
SHINGLES_CHQ = "I had chickenpox as a child and my neighbour now has shingles. How can I avoid getting shingles too?"
ACHALASIA_CHQ = (
    "My sister was told she has achalasia after months of trouble swallowing food and water. What is achalasia and "
    "does it get worse over the years?"
)
COVID_MQP_QUESTION = "Can my cat give me the coronavirus?"


@pytest.fixture(scope="session")
def fake_data(tmp_path_factory) -> Path:
    """Every dataset the benchmarks and the training sources read, a few rows each, in the shared/data layout. RQE
    test and valid hold consumer questions whose entailed FAQ is a MedQuAD question (`GOUT_CHQ`: two MedQuAD records
    with one normalised text, and a second entailed one; `SHINGLES_CHQ`; `ACHALASIA_CHQ`, in valid), and some training
    sources hold copies of them: MeQSum train `SHINGLES_CHQ` in other case, spacing and final punctuation,
    HealthCareMagic valid `ACHALASIA_CHQ` with one letter changed, MQP a COVID-Q question (`COVID_MQP_QUESTION`)."""
    root = tmp_path_factory.mktemp("fake_data")
    medquad = [
        {"id": "m1", "question": "What is gout ?", "source": "GARD"},
        {"id": "m2", "question": "What is gout?", "source": "MPlus"},
        {"id": "m3", "question": "What are the treatments for gout ?", "source": "GARD"},
        {"id": "m4", "question": "How to prevent shingles ?", "source": "NINDS"},
        {"id": "m5", "question": "What is achalasia ?", "source": "GHR"},
        {"id": "m6", "question": "What causes migraine ?", "source": "NINDS"},
    ]
    _put(root / "medquad" / "medquad.jsonl", medquad)
    rqe = root / "mediqa2019_rqe"
    _put(
        rqe / "test.jsonl",
        [
            {"pid": "1", "chq": GOUT_CHQ, "faq": "what is  gout", "label": 1},
            {"pid": "2", "chq": GOUT_CHQ, "faq": "What are the treatments for gout?", "label": 1},
            {"pid": "3", "chq": "Is gout passed on in families? My grandfather had it.", "faq": "Is gout inherited?",
             "label": 1},
            {"pid": "4", "chq": "Shingles at work, should I stay home?", "faq": "How to prevent shingles?", "label": 0},
            {"pid": "5", "chq": SHINGLES_CHQ, "faq": "How to prevent shingles ?", "label": 1},
        ],
    )  # fmt: skip
    _put(
        rqe / "valid.jsonl",
        [
            {"pid": "1", "chq": ACHALASIA_CHQ, "faq": "What is achalasia?", "label": 1},
            {"pid": "2", "chq": "Migraine every week, is it my diet?", "faq": "What causes migraine?", "label": 0},
            {"pid": "3", "chq": GOUT_CHQ, "faq": "What is gout?", "label": 1},
        ],
    )
    _put(
        rqe / "train.jsonl",
        [{"pid": "1", "chq": "Does aspirin thin the blood?", "faq": "Is aspirin a blood thinner?", "label": 1}],
    )
    summaries = {
        "meqsum": {
            "train": [(SHINGLES_CHQ.lower().replace(" ", "  ").rstrip("?") + " ?!", "How to avoid shingles?")],
            "valid": [("Is ibuprofen bad for my stomach? I take it daily.", "Can ibuprofen hurt the stomach?")],
            "test": [("My child has asthma and a cold, is albuterol safe?", "Is albuterol safe for children?")],
        },
        "healthcaremagic": {
            "train": [("Metformin made me lose weight, is that normal?", "Does metformin cause weight loss?")],
            "valid": [(ACHALASIA_CHQ.replace("swallowing", "swalowing"), "What is achalasia?")],
        },
        "chq_summ": {
            "train": [("Where are leukemia trials in Texas?", "Where are clinical trials for leukemia?")],
            "valid": [("Is migraine inherited? My mother has it.", "Is migraine inherited?")],
        },
        "mediqa2021_qs": {
            "valid": [("What dose of amoxicillin for an ear infection?", "What is the dose of amoxicillin?")],
            "test": [
                ("Does measles vaccine last for life? I had it in 1980.", "How long does the measles vaccine last?")
            ],
        },
    }
    for subdir, splits in summaries.items():
        for split, pairs in splits.items():
            _put(root / subdir / f"{split}.jsonl", [{"id": i, "chq": c, "faq": f} for i, (c, f) in enumerate(pairs)])
    (root / "mqp").mkdir()
    (root / "mqp" / "mqp.csv").write_text(
        f"1,{COVID_MQP_QUESTION},Can pets spread the coronavirus?,1\n1,{COVID_MQP_QUESTION},Is my cat sick?,0\n",
        encoding="utf-8",
    )
    quebec = root / "covid_faq" / "quebec_mila"
    _put(quebec / "faqs.jsonl", [{"passage_id": 0, "faq_question": "Must I wear a mask on the bus?"}])
    _put(
        quebec / "train.jsonl",
        [{"id": i, "question": f"bus mask rule number {i}?", "passage_id": 0, "is_ood": False} for i in range(12)],
    )
    covid_q = root / "covid_faq" / "covid_q"
    covid_q.mkdir(parents=True)
    (covid_q / "final_master_dataset.csv").write_text(
        "Category,Question ID,Question,Source,Answers\n"
        "Transmission,1,Can pets spread COVID-19?,faq,Not likely.\n"
        f"Transmission,1,{COVID_MQP_QUESTION},forum,\n"
        "Transmission,1,do dogs carry covid,search,\n"
        "Symptoms,2,What are the symptoms of COVID-19?,faq,Fever and cough.\n"
        "Symptoms,2,covid symptoms list,search,\n",
        encoding="utf-8",
    )
    return root


def _put(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_jsonl(path, rows)
