"""How a summarizer searches for its question: the settings shared by the transformers and CTranslate2 paths."""

from __future__ import annotations

import math
from dataclasses import dataclass

from medfaq.common.runtime import MedfaqError


@dataclass(frozen=True)
class Decoding:
    """Greedy (`num_beams` 1) or beam search with the KV cache.

    `max_length`: new tokens per summary. `length_penalty`: a finished beam scores its summed log-probability divided
    by its length to this power (above 1 favours longer summaries). `guidance` > 0: context-aware decoding with that
    weight (:class:`summarizer.generation.ContextGuidance`, decoder-only fp32 models). `mbr`: how many of the best
    beams a search returns; `Summarizer.summarize` keeps their minimum Bayes risk :func:`consensus` (1 = the best
    beam)."""

    num_beams: int = 1
    max_length: int = 64
    length_penalty: float = 1.0
    guidance: float = 0.0
    mbr: int = 1
    sample: bool = False
    top_p: float = 0.9
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.sample and self.num_beams > 1:
            raise MedfaqError("sampling draws one token at a time: num_beams must be 1")
        if not (0 < self.top_p <= 1 and self.temperature > 0):
            raise MedfaqError(f"top_p must be in (0, 1] and the temperature positive: {self.top_p}, {self.temperature}")
        if min(self.num_beams, self.max_length, self.mbr) < 1:
            raise MedfaqError("num_beams, max_length and the mbr candidates must each be at least 1")
        if not math.isfinite(self.length_penalty):
            raise MedfaqError(f"the length penalty must be a finite number, not {self.length_penalty}")
        if not (math.isfinite(self.guidance) and self.guidance >= 0):
            raise MedfaqError(f"the guidance weight must be a finite number of at least 0, not {self.guidance}")

    @property
    def width(self) -> int:
        """The beam width: at least the number of beams returned (1 when sampling)."""
        return 1 if self.sample else max(self.num_beams, self.mbr)


GREEDY = Decoding()
