"""How `medfaq index adapt` runs (retriever/decisions/adaptation.py): a leaf whose declared fields are the command's
options."""

from __future__ import annotations

from dataclasses import dataclass

from medfaq.common.runtime import MedfaqError
from medfaq.common.settings import check_setting, declared_settings, setting

PARTS = ("answers", "phrasings", "encoder")
"""What an adaptation may add, in the order it is tried."""
ENCODER_LABELS = ("auto", "margin", "hard")


@dataclass
class AdaptConfig:
    """How an index is adapted; saved in the manifest's record of the adaptation."""

    writer: str = setting(
        "question-writer", help="The question writer (`medfaq train question-writer`): a name or directory.", flag=True
    )
    writer_int8: bool = False  # int8 (CTranslate2) sampling wrote noise in other scripts: docs/results.md
    # K and the depth: chosen on development data (docs/results.md, medfaq learns your bank)
    questions_per_faq: int = setting(
        2, help="Questions written per FAQ (one without --dev-queries: the held-back one).", flag="--questions -k", ge=1
    )
    round_trip_depth: int = setting(
        1, help="Round trip: keep a question whose FAQ ranks in this top k (0: keep every one).", flag="--depth", ge=0
    )
    dev_faqs: int = setting(1000, help="FAQs lending one question each to development.", flag=True, ge=1)
    answer_words: int = setting(96, help="Words of the head of each answer added as a row.", ge=1)
    answer_with_question: bool = True  # also the FAQ's question followed by that head: docs/results.md
    parts: list[str] = setting(  # checked by __post_init__ (a declaration's choices are one value's)
        default_factory=lambda: list(PARTS),
        help=f"What may be added, each only where it wins: {' | '.join(PARTS)} (repeatable).",
        flag="--part",
    )
    seed: int = setting(0, help="Random seed of the sampling and the development split.", flag=True)
    top_p: float = 0.9
    batch_size: int = 16
    encoder_labels: str = setting(
        "auto",
        help="The adapted encoder's labels; margin: the reranker's, auto: margin where a reranker is set up.",
        flag="--labels",
        choices=ENCODER_LABELS,
    )
    encoder_negatives: int = 1  # near misses mined per generated question
    near_duplicate: float = 0.9  # a near miss this close (cosine) to the FAQ counts as a false negative: dropped
    encoder_epochs: int = 1
    encoder_lr: float = 2e-5
    force: bool = False  # apply every part whatever the rule says (to measure each part alone; recorded)

    def __post_init__(self) -> None:
        for declared in declared_settings(AdaptConfig).values():
            check_setting(declared, getattr(self, declared.name))
        unknown = sorted(set(self.parts) - set(PARTS))
        if unknown:
            raise MedfaqError(f"unknown adaptation part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
