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

from medfaq.common.runtime import PRECISION_HELP, MedfaqError, choose_device
from medfaq.common.settings import Declared, check_setting
from medfaq.retriever.pipeline import PipelineConfig, pipeline_settings
from medfaq.retriever.trained_models import AUTO_ENCODER


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
    help="auto (the best fine-tuned bi-encoder `medfaq setup` trained: MPNet, else MiniLM; else the stock encoder the "
    "encoder rule chooses, mpnet), "
    "minilm, mpnet (stock all-mpnet-base-v2), a model directory or a hub id.",
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


def existing_device(value: str | None) -> str | None:
    """Option callback: a device this machine has (`common.runtime.choose_device`), checked before any work."""
    if value is not None:
        try:
            choose_device(value)
        except MedfaqError as error:
            raise typer.BadParameter(str(error)) from None
    return value


DEVICE = typer.Option(  # every command that takes --device
    None, "--device", callback=existing_device, help="cpu | cuda (default: cuda when available)."
)


def port_option(default: int, help: str) -> Any:
    """``--port``: a TCP port, 1 to 65535 (anything else is a one-line usage error); `serve` and `demo`."""
    return typer.Option(default, "--port", min=1, max=65535, help=help)


@dataclass(frozen=True)
class SharedOption:
    """One option of a group several commands take together: the type of its value, its typer option and `aliases`:
    hidden typer options that stand for it (older spellings), read when it is not given."""

    kind: Any
    option: Any
    aliases: tuple[Any, ...] = ()


Command = TypeVar("Command", bound=Callable[..., Any])


def takes_group(
    group: dict[str, SharedOption], parameter: str, collect: Callable[..., Any], without: tuple[str, ...] = ()
) -> Callable[[Command], Command]:
    """Decorator of a command with a `parameter` parameter: typer sees the group's options (all but `without`, in the
    group's order, each followed by its aliases) in that parameter's place, and the command gets
    ``collect(**values given)`` there. The command's annotations must resolve in its module (typer reads them)."""
    names = [name for name in group if name not in without]
    aliases = {name: [f"{name}_alias{n}" for n in range(len(group[name].aliases))] for name in names}

    def decorate(command: Command) -> Command:
        hints = get_type_hints(command)
        parameters: list[inspect.Parameter] = []
        for declared in inspect.signature(command).parameters.values():
            if declared.name != parameter:
                parameters.append(declared.replace(annotation=hints[declared.name]))
                continue
            for name in names:
                option = group[name]
                for key, default in zip([name, *aliases[name]], [option.option, *option.aliases], strict=True):
                    parameters.append(inspect.Parameter(key, declared.kind, default=default, annotation=option.kind))

        def value(given: dict[str, Any], name: str) -> Any:
            spellings = [given.pop(key) for key in (name, *aliases[name])]
            return next((spelled for spelled in spellings if spelled is not None), None)

        @functools.wraps(command)
        def run(**given: Any) -> Any:
            values = collect(**{name: value(given, name) for name in names})
            return command(**given, **{parameter: values})

        run.__signature__ = inspect.Signature(parameters, return_annotation=hints.get("return"))  # type: ignore[attr-defined]
        run.__annotations__ = {declared.name: declared.annotation for declared in parameters}
        return run  # type: ignore[return-value]

    return decorate


def keywords(group: dict[str, SharedOption], values: dict[str, Any]) -> dict[str, Any]:
    """`values` of every option of `group`, by name; None where not given."""
    return {name: values.get(name) for name in group}


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
    "length_buckets": SharedOption(
        bool | None,
        typer.Option(
            None,
            "--length-buckets/--no-length-buckets",
            help="Bi-encoder: questions of similar length share a batch, so less padding is computed (override).",
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


def checked_by(declared: Declared) -> Callable[[Any], Any]:
    """Option callback: a value `declared` refuses is a one-line usage error; None (not given) passes."""

    def checked(value: Any) -> Any:
        if value is not None:
            try:
                check_setting(declared, value)
            except MedfaqError as error:
                raise typer.BadParameter(str(error)) from None
        return value

    return checked


def declared_option(declared: Declared, *, with_default: bool = False) -> SharedOption:
    """The option of a declared setting that declares a flag (a stage flag, a config field's option): spelled as
    declared (a bool's ``--x/--no-x`` unless the declaration spells both switches; a short name may follow the flag,
    ``--questions -k``; a list is a repeatable option of text), its help with its limits, its aliases hidden; its
    default is None (not given), or with `with_default` the declared default, shown in the help (then it has no
    aliases: a default would hide them)."""
    if with_default and declared.setting.aliases:
        raise ValueError(f"{declared.name}: an option with aliases defaults to None (not given)")
    flag, *short = declared.flag.split()
    if declared.kind is bool and "/" not in flag:
        flag = f"{flag}/--no-{flag.removeprefix('--')}"
    kind = list[str] if declared.kind is list else declared.kind
    checked = checked_by(declared)
    default = declared.default if with_default else None
    option = typer.Option(default, flag, *short, callback=checked, help=declared.describe())
    aliases = tuple(typer.Option(None, alias, callback=checked, hidden=True) for alias in declared.setting.aliases)
    return SharedOption(kind | None, option, aliases)


# `search`, `bench`, `eval retrieval` and `demo --cli`: the pipeline flags (None: the index's pipeline.json), built from
# the settings that declare a flag (PipelineConfig's and each registered stage's, retriever/stages/) and named by their
# flat names; a command takes them with @takes_stage_flags() where its `flags` parameter stands, as the
# `PipelineConfig.with_flags` keywords they are.
STAGE_FLAGS: dict[str, SharedOption] = {
    name: declared_option(declared) for name, declared in pipeline_settings().items() if declared.flag
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

    def overrides(self, **changes: Any) -> dict[str, Any]:
        """The flags given, then `changes`, by their setting's flat name (None values left out): what
        :meth:`PipelineConfig.with_flags` and :func:`retriever.pipeline_file.read_config` apply."""
        given = {name: self.values.get(name) for name in STAGE_FLAGS} | changes
        return {name: value for name, value in given.items() if value is not None}

    def apply(self, config: PipelineConfig, **changes: Any) -> PipelineConfig:
        """`config` with the flags given, then `changes` (None values ignored), applied."""
        return config.with_flags(**self.overrides(**changes))


NO_STAGE_FLAGS = StageFlags()  # the default of a command's `flags` parameter, where the options go


def takes_stage_flags(
    *, without: tuple[str, ...] = (), only: tuple[str, ...] | None = None
) -> Callable[[Command], Command]:
    """The options of STAGE_FLAGS (those of `only`, else all but `without`) in place of the command's `flags`
    parameter, which gets the values given as one StageFlags."""
    skipped = without if only is None else tuple(name for name in STAGE_FLAGS if name not in only)
    return takes_group(STAGE_FLAGS, "flags", StageFlags, skipped)
