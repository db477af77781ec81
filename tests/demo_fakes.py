"""A tiny FAQ index and word-overlap stand-ins for the summarizer, reranker, summary likelihood and NER, shared by the
demo tests.

`install()` swaps the demo's model loaders for these stand-ins; the browser test runs it in the served app too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from medfaq.retriever.pipeline_file import store_threshold, write_config
from medfaq.summarizer.entities import Entity

FAQS = [
    ("f1", "Can I drink alcohol while taking amoxicillin?", "Moderate drinking does not stop amoxicillin working."),
    ("f2", "What are the symptoms of type 2 diabetes?", "Thirst, frequent urination, tiredness."),
    ("f3", "How is shingles treated?", "Antiviral medicines started early; a vaccine prevents it."),
    ("f4", "Is Parkinson's disease inherited?", "Most cases are not inherited."),
    ("f5", "What causes migraine headaches?", ""),
    ("f6", "How do vaccines protect against measles?", "They train the immune system."),
]
TERMS = {"amoxicillin": "drug", "alcohol": "drug", "diabetes": "disease", "parkinson's": "disease", "thirst": "symptom"}


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9']+", text.lower()))


class FakeSummarizer:
    """'Summarizes' by keeping the last sentence that ends with a question mark."""

    def rewrite(self, texts: list[str]) -> list[str]:
        return [(re.findall(r"[^.?!]*\?", text) or [text])[-1].strip() for text in texts]


class FakeReranker:
    """Scores by the share of the candidate's words that the query contains."""

    def score(self, query: str, candidates: list[str]) -> list[float]:
        asked = words(query)
        return [len(asked & words(c)) / max(1, len(words(c))) for c in candidates]


class FakeLikelihood:
    """The summary likelihood's stand-in: the reranker's word overlap (no prior)."""

    def score(self, query: str, candidates: list[str], prior_weight: float, per_token: bool) -> list[float]:
        return FakeReranker().score(query, candidates)


class FakeEntities:
    def find(self, text: str) -> list[Entity]:
        lowered = text.lower()
        return [
            Entity(text[m.start() : m.end()], m.start(), m.end(), label)
            for term, label in TERMS.items()
            for m in re.finditer(re.escape(term), lowered)
        ]


def write_collection(path: Path) -> Path:
    rows = [
        {"id": i, "question": q, "answer": a, "source": "TinyFAQ", "url": f"https://example.org/faq/{i}"}
        for i, q, a in FAQS
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def page_default_config():
    """The configuration the search page runs with every stage on (summary fused with the question, reranked)."""
    from medfaq.retriever.pipeline import PipelineConfig

    return PipelineConfig().updated(summarize=True, query_source="both", rerank=True)


def build_demo_home(home: Path, encoder) -> dict[str, str]:
    """A tiny index (its pipeline.json turning every stage on, with a threshold of 0.5 calibrated for that
    configuration only) and two stand-in model directories under `home`; returns the demo's environment variables."""
    from medfaq.index.collections import load_collection
    from medfaq.index.faq_index import FaqIndex

    home.mkdir(parents=True, exist_ok=True)
    records, _ = load_collection(str(write_collection(home / "faqs.jsonl")))
    index_dir = home / "indexes" / "tiny"
    FaqIndex.build(records, encoder, progress=False).save(index_dir)
    write_config(index_dir, page_default_config())  # every stage on, as a pipeline.json may ask
    store_threshold(index_dir, page_default_config(), 0.5)
    models = {}
    for name in ("summarizer", "reranker"):
        (home / "models" / name).mkdir(parents=True)
        (home / "models" / name / "config.json").write_text("{}", encoding="utf-8")
        models[name] = str(home / "models" / name)
    return {
        "MEDFAQ_HOME": str(home),
        "MEDFAQ_DEMO_INDEX": str(index_dir),
        "MEDFAQ_DEMO_SUMMARIZER": models["summarizer"],
        "MEDFAQ_DEMO_RERANKER": models["reranker"],
        "MEDFAQ_DEMO_NO_TRAIN": "1",
    }


def install(set_attribute=setattr) -> None:
    """Make the demo load the stand-ins instead of real models (`set_attribute`: e.g. ``monkeypatch.setattr``)."""
    from medfaq.retriever import model_cache

    stand_ins = {
        "rewrite": FakeSummarizer,
        "rerank": FakeReranker,
        "likelihood": FakeLikelihood,
        "entities": FakeEntities,
    }
    loaders = {kind: model_cache.StageLoader(lambda model, make=make: make()) for kind, make in stand_ins.items()}
    set_attribute(model_cache, "_STAGE_LOADERS", {**model_cache._STAGE_LOADERS, **loaders})
