"""Command-line options built from a config dataclass's :func:`~medfaq.common.settings.setting` declarations: each
field that declares a flag becomes an option named, typed, bounded and explained by its declaration
(:func:`~medfaq.app.options.declared_option`, as the stage flags are), so a new field of the config needs no edit in
the commands that take its options."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from medfaq.app.options import Command, SharedOption, declared_option, takes_group
from medfaq.common.settings import declared_settings


def declared_options(config: type, *, with_defaults: bool = False) -> dict[str, SharedOption]:
    """The options of the fields of the dataclass `config` that declare a flag, by field name, in their order; their
    defaults None (not given), or with `with_defaults` the config's."""
    return {
        name: declared_option(declared, with_default=with_defaults)
        for name, declared in declared_settings(config).items()
        if declared.flag
    }


def given_values(**values: Any) -> dict[str, Any]:
    """The options given (not None), by field name."""
    return {name: value for name, value in values.items() if value is not None}


def takes_config_options(
    config: type, parameter: str = "overrides", *, only: tuple[str, ...] | None = None, with_defaults: bool = False
) -> Callable[[Command], Command]:
    """The options of `config`'s fields that declare a flag (those of `only`, else all) in place of the command's
    `parameter`, which gets their values as a dict of `config` keywords: those given (an option not given is
    absent), or with `with_defaults` (a command with no preset over the config) each option's value, the config's
    default unless given, shown in the help (None values left out)."""
    options = declared_options(config, with_defaults=with_defaults)
    unknown = sorted(set(only or ()) - set(options))
    if unknown:
        raise ValueError(f"{config.__name__} declares no flag for {', '.join(unknown)}")
    without = () if only is None else tuple(name for name in options if name not in only)
    return takes_group(options, parameter, given_values, without)
