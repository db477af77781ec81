"""The real MiniLM over a few hundred MedQuAD FAQs: hand-written paraphrases find their FAQ in the top 3."""

from __future__ import annotations

import random

import pytest

from medfaq.index.collections import load_collection
from medfaq.index.encoder import Encoder
from medfaq.index.faq_index import FaqIndex
from medfaq.retriever.search import Retriever

pytestmark = pytest.mark.integration

PARAPHRASES = {
    "6_0000265-2": "how do doctors treat tay sachs in babies",
    "5_0000120-7": "what problems can short bowel syndrome lead to",
    "4_0000389-1": "can you explain what gangrene is",
    "5_0000089-2": "why does a child keep having diarrhea for weeks",
    "4_0000256-1": "tell me about blood clots in the deep veins of the leg (DVT)",
    "6_0000021-3": "what is the prognosis for a child with angelman syndrome",
    "4_0000383-1": "what happens to your skin with frostbite",
    "4_0000005-1": "what is acne, the pimples teenagers get",
    "6_0000101-1": "what is lewy body dementia",
    "5_0000014-9": "treatment options for primary hyperparathyroidism",
    "4_0000058-1": "where can I learn about artificial legs and arms",
    "4_0000895-1": "what does tinnitus mean",
}
FOLDERS = {"4_MPlus_Health_Topics_QA", "5_NIDDK_QA", "6_NINDS_QA"}


@pytest.fixture(scope="module")
def medquad_sample(shared_data):
    records, _ = load_collection(shared_data / "medquad" / "medquad.jsonl")
    pool = [r for r in records if r.answer and r.metadata["collection"] in FOLDERS]
    return random.Random(0).sample(pool, 300)


def test_paraphrases_find_their_faq_in_top_3(medquad_sample):
    assert set(PARAPHRASES) <= {r.id for r in medquad_sample}
    index = FaqIndex.build(medquad_sample, Encoder("minilm", device="cpu"), progress=False)
    ids = list(PARAPHRASES)
    for mode in ("dense", "hybrid"):
        results = Retriever(index, mode).search([PARAPHRASES[i] for i in ids], top_k=3)
        missed = {i: [h.question for h in hits] for i, hits in zip(ids, results) if i not in {h.id for h in hits}}
        assert not missed, f"{mode}: {missed}"
