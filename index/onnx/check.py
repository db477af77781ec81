"""A derived model (an int8 graph, another runtime) checked against its fp32 source before it is used.

Both run a small search on fixed probe texts: each consumer question of :data:`PROBE_QUESTIONS` against the FAQ
questions of :data:`PROBE_FAQS`. For an encoder the scores are the cosines of their vectors, for a reranker its
logits of every (question, FAQ) pair. The derived model passes when every vector keeps a cosine of at least
:data:`MIN_COSINE` with its source's (encoders), every question keeps its best FAQ in all but one of
:data:`PROBE_QUESTIONS`' searches, and the order of each question's FAQs agrees (Kendall's tau, averaged) to at least
:data:`MIN_KENDALL_TAU`. A fast wrong answer is worse than a refusal: a model that fails is not used.

The numbers depend on the CPU's int8 kernels (VNNI and AMX, or AVX2's saturating VPMADDUBSW), so a check records
the CPU it ran on (:func:`cpu_signature`), and a graph checked on another CPU is checked again where it runs.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from medfaq.common.runtime import MedfaqError

PROBE_QUESTIONS = [
    "can i drink a glass of wine while im on amoxicillin for a tooth infection",
    "my 6 year old has a rash on his belly and a fever, could it be chickenpox",
    "is it normal to feel dizzy after starting blood pressure pills",
    "what should i eat if i have type 2 diabetes, i love bread",
    "how long does the flu shot take to work before I travel",
    "my dad keeps forgetting names, are these early signs of alzheimers",
    "can stress give you migraines every week",
    "is shingles contagious to my pregnant sister",
    "why does my knee hurt when i climb stairs, im 45",
    "how do i know if i have covid or just a cold",
    "can i take ibuprofen after getting a tattoo",
    "what are the side effects of metformin on the stomach",
]
"""Consumer questions, the i-th asked about the i-th of :data:`PROBE_FAQS`."""
PROBE_FAQS = [
    "Can I drink alcohol while taking antibiotics?",
    "What are the symptoms of chickenpox in children?",
    "What are the side effects of blood pressure medicines?",
    "What is a healthy diet for people with diabetes?",
    "How long does it take for the flu vaccine to work?",
    "What are the early signs of Alzheimer's disease?",
    "What triggers migraine headaches?",
    "Is shingles contagious?",
    "What causes knee pain?",
    "How is COVID-19 different from the common cold?",
    "Which pain relievers are safe after a tattoo?",
    "What are the side effects of metformin?",
]
MIN_COSINE = 0.95
"""Smallest cosine an encoder's derived vector may keep with its source's (on the probes, MiniLM int8: 0.99;
all-mpnet-base-v2 int8 with every MatMul quantised: 0.82)."""
MIN_KENDALL_TAU = 0.8
MAX_TOP1_CHANGES = 1
"""Probe searches whose best FAQ may change."""
CPU_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "asimd", "sve")
"""The instruction sets that choose ONNX Runtime's and PyTorch's int8 kernels."""


def probe_pairs() -> list[tuple[str, str]]:
    """Every (question, FAQ) pair of the probe search, row by row."""
    return [(question, faq) for question in PROBE_QUESTIONS for faq in PROBE_FAQS]


@functools.cache
def cpu_signature() -> str:
    """The machine and the int8-relevant instruction sets of this CPU, e.g. ``x86_64:avx2,avx512_vnni``."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return f"{platform.machine()}:{','.join(flag for flag in CPU_FLAGS if flag in flags)}"


@dataclass
class GraphCheck:
    """How a derived model agreed with its source on the probe search, and whether that passes."""

    backend: str
    passed: bool
    top1_changes: int
    kendall_tau: float
    min_cosine: float | None = None
    setting: str = ""
    cpu: str = ""
    bounds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GraphCheck:
        return cls(**data)

    def describe(self) -> str:
        """One line of its numbers and the CPU they were measured on, e.g. ``min cosine 0.82 (bound 0.95), best FAQ
        changed in 3 of 12 probe searches (bound 1), Kendall tau 0.62 (bound 0.8), on x86_64:avx2``."""
        parts = []
        if self.min_cosine is not None:
            parts.append(f"min cosine {self.min_cosine:.3f} (bound {MIN_COSINE})")
        searches = len(PROBE_QUESTIONS)
        parts.append(f"best FAQ changed in {self.top1_changes} of {searches} probe searches (bound {MAX_TOP1_CHANGES})")
        parts.append(f"Kendall tau {self.kendall_tau:.3f} (bound {MIN_KENDALL_TAU})")
        if self.cpu:
            parts.append(f"on {self.cpu}")
        return ", ".join(parts)


def compare(
    backend: str, source_scores: np.ndarray, scores: np.ndarray, cosines: np.ndarray | None = None, setting: str = ""
) -> GraphCheck:
    """Check a derived model's probe-search `scores` (questions x FAQs) against its source's; `cosines`: each
    derived vector's cosine with its source vector (encoders)."""
    from scipy.stats import kendalltau

    changes = int((source_scores.argmax(1) != scores.argmax(1)).sum())
    taus = [kendalltau(a, b).statistic for a, b in zip(source_scores, scores, strict=True)]
    tau = float(np.nanmean(taus)) if not np.all(np.isnan(taus)) else 0.0
    min_cosine = None if cosines is None else float(np.min(cosines))
    passed = changes <= MAX_TOP1_CHANGES and tau >= MIN_KENDALL_TAU and (min_cosine is None or min_cosine >= MIN_COSINE)
    bounds = {"max_top1_changes": MAX_TOP1_CHANGES, "min_kendall_tau": MIN_KENDALL_TAU}
    if cosines is not None:
        bounds["min_cosine"] = MIN_COSINE
    return GraphCheck(backend, passed, changes, tau, min_cosine, setting, cpu_signature(), bounds)


def require_agreement(check: GraphCheck, what: str, works: str) -> None:
    """One-line refusal of the derived model `what` where `check` failed; `works`: what to use instead."""
    if not check.passed:
        raise MedfaqError(f"{what} disagrees with its fp32 source ({check.describe()}); it is not used: {works}")


def encoder_scores(vectors: np.ndarray) -> np.ndarray:
    """The probe search of unit `vectors` (:data:`PROBE_QUESTIONS` then :data:`PROBE_FAQS`): questions x FAQs."""
    count = len(PROBE_QUESTIONS)
    return vectors[:count] @ vectors[count:].T


def check_encoder(backend: str, source: np.ndarray, derived: np.ndarray, setting: str = "") -> GraphCheck:
    """Check the unit vectors of the probe texts (:data:`PROBE_QUESTIONS` then :data:`PROBE_FAQS`) of a derived
    encoder against its source's."""
    cosines = np.einsum("ij,ij->i", source, derived)
    return compare(backend, encoder_scores(source), encoder_scores(derived), cosines, setting)


def check_pair_scores(backend: str, source: np.ndarray, derived: np.ndarray, setting: str = "") -> GraphCheck:
    """Check the logits of :func:`probe_pairs` of a derived reranker against its source's."""
    shape = (len(PROBE_QUESTIONS), len(PROBE_FAQS))
    return compare(backend, source.reshape(shape), derived.reshape(shape), setting=setting)


def probe_texts() -> list[str]:
    """The texts an encoder is checked on: :data:`PROBE_QUESTIONS` then :data:`PROBE_FAQS`."""
    return PROBE_QUESTIONS + PROBE_FAQS
