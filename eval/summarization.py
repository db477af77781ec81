"""Question-summarization metrics: ROUGE, focus identification rate (FIR) and medical-entity consistency.

All values are percentages.

* ROUGE-1/2/L: `rouge-score`, Porter-stemmed F1, averaged over samples.
* FIR (ECL): the share of samples whose generated question contains the focus of the reference, i.e. at least one
  focus term as whole words (case-insensitive). Two strategies name the focus: ``entity`` = the medical entities
  of the reference FAQ (NER), ``overlap`` = the phrases the reference FAQ shares with its CHQ (QFCL's focus).
  Samples whose reference has no focus under a strategy are left out of that strategy's rate (their count is
  reported as ``fir_<strategy>_n``). ``fir`` is the entity strategy.
* Entity consistency: Σ|E(ref) ∩ E(gen)| / Σ|E(ref)| over case-folded entity strings found by NER in both.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from medfaq.summarizer.entities import WORD, EntityRecognizer, load_recognizer, shared_phrases, term_key

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
MAIN_METRICS = ("rouge1", "rouge2", "rougeL", "fir", "fir_entity", "fir_overlap", "entity_consistency")


def sample_rouge(predictions: Sequence[str], references: Sequence[str]) -> list[dict[str, float]]:
    """ROUGE-1/2/L F1 (stemmed) in percent of each prediction against its reference."""
    from rouge_score.rouge_scorer import RougeScorer

    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    scorer = RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    return [
        {name: 100.0 * score.fmeasure for name, score in scorer.score(reference, prediction).items()}
        for prediction, reference in zip(predictions, references)
    ]


def rouge_scores(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean ROUGE-1/2/L F1 (stemmed) in percent."""
    samples = sample_rouge(predictions, references)
    return {name: sum(sample[name] for sample in samples) / len(samples) if samples else 0.0 for name in ROUGE_TYPES}


def _padded_words(text: str) -> str:
    """`text` as case-folded words between spaces, for whole-word phrase containment."""
    return f" {term_key(text)} "


def contains_any(text: str, terms: set[str]) -> bool:
    """True when `text` contains one of the normalised `terms` (see :func:`term_key`) as whole words."""
    padded = _padded_words(text)
    return any(f" {term} " in padded for term in terms)


def focus_identification_rate(predictions: Sequence[str], focuses: Sequence[set[str]]) -> tuple[float, int]:
    """(percent of samples with a focus whose prediction contains one of its terms, number of such samples)."""
    scored = [contains_any(prediction, focus) for prediction, focus in zip(predictions, focuses) if focus]
    return (100.0 * sum(scored) / len(scored) if scored else 0.0), len(scored)


def entity_consistency(reference_entities: Sequence[set[str]], predicted_entities: Sequence[set[str]]) -> float:
    """Σ|E(ref) ∩ E(gen)| / Σ|E(ref)| in percent (0 when the references have no entity)."""
    total = sum(len(ref) for ref in reference_entities)
    kept = sum(len(ref & gen) for ref, gen in zip(reference_entities, predicted_entities))
    return 100.0 * kept / total if total else 0.0


class SummarizationEvaluator:
    """Scores generated questions against fixed references; NER and focus phrases of the references run once.

    ``evaluator(predictions)`` prints a table to `stream` and returns the metrics (percent) plus the sample counts.
    """

    def __init__(
        self,
        chqs: Sequence[str],
        references: Sequence[str],
        recognizer: EntityRecognizer | None = None,
        name: str = "",
        stream: TextIO | None = None,
    ) -> None:
        if len(chqs) != len(references):
            raise ValueError(f"{len(chqs)} CHQs but {len(references)} references")
        self.references = list(references)
        self.recognizer = recognizer or load_recognizer()
        self.name = name
        self.stream = stream
        self.reference_entities = [self.entity_keys(reference) for reference in self.references]
        self.overlap_focus = [
            {term_key(phrase.text) for phrase in shared_phrases(chq, reference)}
            for chq, reference in zip(chqs, self.references)
        ]

    @classmethod
    def from_pairs(cls, pairs, **kwargs) -> SummarizationEvaluator:
        """From `eval.summarization_data.SummaryPair`s (anything with `.chq` and `.faq`)."""
        return cls([pair.chq for pair in pairs], [pair.faq for pair in pairs], **kwargs)

    def entity_keys(self, text: str) -> set[str]:
        return {key for entity in self.recognizer.find(text) if (key := term_key(entity.text))}

    def __call__(self, predictions: Sequence[str]) -> dict[str, float]:
        if len(predictions) != len(self.references):
            raise ValueError(f"{len(predictions)} predictions for {len(self.references)} references")
        metrics = rouge_scores(predictions, self.references)
        fir_entity, n_entity = focus_identification_rate(predictions, self.reference_entities)
        fir_overlap, n_overlap = focus_identification_rate(predictions, self.overlap_focus)
        metrics |= {
            "fir": fir_entity,
            "fir_entity": fir_entity,
            "fir_overlap": fir_overlap,
            "entity_consistency": entity_consistency(
                self.reference_entities, [self.entity_keys(prediction) for prediction in predictions]
            ),
            "n": len(predictions),
            "fir_entity_n": n_entity,
            "fir_overlap_n": n_overlap,
            "empty_predictions": sum(not WORD.search(prediction) for prediction in predictions),
            "distinct_outputs": len({" ".join(p.lower().split()) for p in predictions}),  # a collapse shows here
        }
        print(format_table(metrics, self.name), file=self.stream or sys.stdout)
        return metrics


def format_table(metrics: dict[str, float], title: str = "") -> str:
    """The main metrics as a two-column text table."""
    lines = [f"{title} ({int(metrics['n'])} samples)" if title else f"{int(metrics['n'])} samples"]
    lines += [f"  {name:<20} {metrics[name]:6.2f}" for name in MAIN_METRICS]
    return "\n".join(lines)
