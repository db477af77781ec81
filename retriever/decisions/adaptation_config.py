"""How `medfaq index adapt` runs (retriever/decisions/adaptation.py): a leaf the command line reads its defaults
from."""

from __future__ import annotations

from dataclasses import dataclass, field

from medfaq.common.runtime import MedfaqError

PARTS = ("answers", "phrasings", "encoder")
"""What an adaptation may add, in the order it is tried."""


@dataclass
class AdaptConfig:
    """How an index is adapted; saved in the manifest's record of the adaptation."""

    writer: str = "question-writer"
    writer_int8: bool = False  # int8 (CTranslate2) sampling wrote noise in other scripts: docs/results.md
    questions_per_faq: int = 2  # K and the depth: chosen on development data (docs/results.md, medfaq learns your bank)
    round_trip_depth: int = 1  # 0: no round trip (every written question is used)
    dev_faqs: int = 1000  # FAQs that each lend one generated question to the development queries
    answer_words: int = 96
    answer_with_question: bool = True  # also the FAQ's question followed by that head: docs/results.md
    parts: list[str] = field(default_factory=lambda: list(PARTS))
    seed: int = 0
    top_p: float = 0.9
    batch_size: int = 16
    encoder_labels: str = "auto"  # margin (the reranker's) | hard | auto: margin where a reranker is set up
    encoder_negatives: int = 1  # near misses mined per generated question
    near_duplicate: float = 0.9  # a near miss this close (cosine) to the FAQ counts as a false negative: dropped
    encoder_epochs: int = 1
    encoder_lr: float = 2e-5
    force: bool = False  # apply every part whatever the rule says (to measure each part alone; recorded)

    def __post_init__(self) -> None:
        if self.encoder_labels not in ("auto", "margin", "hard"):
            raise MedfaqError(f"unknown encoder labels {self.encoder_labels!r}; choose auto, margin or hard")
        unknown = sorted(set(self.parts) - set(PARTS))
        if unknown:
            raise MedfaqError(f"unknown adaptation part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
        if min(self.questions_per_faq, self.answer_words) < 1 or min(self.dev_faqs, self.round_trip_depth) < 0:
            raise MedfaqError("questions per FAQ and answer words must be at least 1, the round-trip depth 0 or more")
