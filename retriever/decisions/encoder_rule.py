"""The rule that chooses a retrieval encoder, written before any candidate was measured, and the stock encoders'
measurements it reads when no fine-tuned encoder is saved.

The rule (:class:`EncoderRule`): among the candidates (an encoder on a backend) whose median time to encode one long
consumer question is within the bound and whose cold ``medfaq search`` takes at most the bound on 2 CPU cores (and,
for an index that must be searchable soon after a first start, whose MedQuAD build fits its bound), the best mean
development R@1 wins; candidates within `quality_tie` of the best count as equal, and the fastest of them wins.
``python experiments/encoder_choice.py`` measures candidates and applies it; ``--encoder auto`` applies it to the
stock encoders' measurements shipped in ``stock_encoders.json`` (package data, each with the command that measured
it).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from medfaq.common.runtime import MedfaqError

STOCK_ENCODERS_FILE = Path(__file__).with_name("stock_encoders.json")
FIRST_RUN_BUILD_MINUTES = 10.0
"""The bound on building the whole MedQuAD index for an index a first start must search soon (the demo's first run):
a newcomer waits for it before the first answer."""


@dataclass(frozen=True)
class EncoderRule:
    """The bounds a default encoder must meet, and how close in quality two candidates count as equal."""

    max_long_p50_ms: float = 200.0
    max_cold_search_s: float = 1.5
    quality_tie: float = 0.5
    max_build_minutes: float | None = None  # MedQuAD's whole build; None: no bound


@dataclass
class Candidate:
    """One encoder on one backend, with what the rule reads."""

    model: str
    backend: str
    dev_recall_at_1: float
    long_p50_ms: float = float("nan")
    cold_search_s: float = float("nan")
    per_set: dict[str, float] = field(default_factory=dict)
    long_p50_rounds: list[float] = field(default_factory=list)
    cold_search_runs: list[float] = field(default_factory=list)
    build_minutes: float | None = None  # MedQuAD's whole build, where measured

    @property
    def label(self) -> str:
        return f"{self.model}:{self.backend}"

    def add_round(self, long_p50_ms: float, cold_search_runs: Sequence[float]) -> None:
        """Record one round's timings; the times the rule reads become the medians over the rounds so far."""
        self.long_p50_rounds.append(long_p50_ms)
        self.cold_search_runs.extend(cold_search_runs)
        self.long_p50_ms = statistics.median(self.long_p50_rounds)
        self.cold_search_s = statistics.median(self.cold_search_runs)


def too_slow(candidate: Candidate, rule: EncoderRule) -> str | None:
    """Why `candidate` misses one of `rule`'s speed bounds, or None."""
    if candidate.long_p50_ms > rule.max_long_p50_ms:
        return f"long question p50 {candidate.long_p50_ms:.0f} ms > {rule.max_long_p50_ms:.0f}"
    if candidate.cold_search_s > rule.max_cold_search_s:
        return f"cold search {candidate.cold_search_s:.2f} s > {rule.max_cold_search_s}"
    bound = rule.max_build_minutes
    if bound is not None and (candidate.build_minutes is None or candidate.build_minutes > bound):
        return f"MedQuAD build {candidate.build_minutes} min, bound {bound:g}"
    return None


def choose(candidates: Sequence[Candidate], rule: EncoderRule = EncoderRule()) -> tuple[Candidate, dict[str, str]]:
    """The default by `rule`, and why each candidate was or was not chosen."""
    reasons: dict[str, str] = {}
    eligible = []
    for candidate in candidates:
        slow = too_slow(candidate, rule)
        if slow:
            reasons[candidate.label] = slow
        else:
            eligible.append(candidate)
    if not eligible:
        raise MedfaqError("no candidate meets the speed bounds: " + "; ".join(f"{k}: {v}" for k, v in reasons.items()))
    best = max(candidate.dev_recall_at_1 for candidate in eligible)
    tied = [candidate for candidate in eligible if candidate.dev_recall_at_1 >= best - rule.quality_tie]
    chosen = min(tied, key=lambda candidate: candidate.long_p50_ms)
    for candidate in eligible:
        if candidate is chosen:
            reasons[candidate.label] = "chosen"
        elif candidate in tied:
            reasons[candidate.label] = f"as good (within {rule.quality_tie} R@1) but slower"
        else:
            reasons[candidate.label] = f"dev R@1 {candidate.dev_recall_at_1:.1f} < {best:.1f}"
    return chosen, reasons


@cache
def stock_record() -> dict[str, Any]:
    """The stock encoders' measurements (``stock_encoders.json``)."""
    return json.loads(STOCK_ENCODERS_FILE.read_text(encoding="utf-8"))


def stock_encoder(first_run: bool = False) -> str:
    """The stock encoder the rule chooses from the shipped measurements (`first_run`: with the first-run build bound,
    for the index the demo builds on its first start)."""
    fields = set(Candidate.__dataclass_fields__)
    candidates = [
        Candidate(**{key: value for key, value in row.items() if key in fields}) for row in stock_record()["candidates"]
    ]
    rule = EncoderRule(max_build_minutes=FIRST_RUN_BUILD_MINUTES if first_run else None)
    return choose(candidates, rule)[0].model
