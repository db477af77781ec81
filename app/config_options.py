"""Command-line options built from a config dataclass's :func:`~medfaq.common.settings.setting` declarations: each
field that declares a flag becomes an option (None: not given) named, typed, bounded and explained by its declaration,
so a new field of the config needs no edit in the commands that take its options."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from medfaq.app.options import Command, SharedOption, takes_group
from medfaq.common.runtime import MedfaqError
from medfaq.common.settings import Declared, check_setting, declared_settings


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


def declared_option(declared: Declared) -> SharedOption:
    """The option of a field that declares a flag (None: not given): spelled as declared (a bool's ``--x/--no-x``
    unless the declaration spells both switches), its help with its limits, its aliases hidden."""
    flag = declared.flag
    if declared.kind is bool and "/" not in flag:
        flag = f"{flag}/--no-{flag.removeprefix('--')}"
    checked = checked_by(declared)
    option = typer.Option(None, flag, callback=checked, help=declared.describe())
    aliases = tuple(typer.Option(None, alias, callback=checked, hidden=True) for alias in declared.setting.aliases)
    return SharedOption(declared.kind | None, option, aliases)


def declared_options(config: type) -> dict[str, SharedOption]:
    """The options of the fields of the dataclass `config` that declare a flag, by field name, in their order."""
    return {name: declared_option(declared) for name, declared in declared_settings(config).items() if declared.flag}


def given_values(**values: Any) -> dict[str, Any]:
    """The options given (not None), by field name."""
    return {name: value for name, value in values.items() if value is not None}


def takes_config_options(
    config: type, parameter: str = "overrides", *, only: tuple[str, ...] | None = None
) -> Callable[[Command], Command]:
    """The options of `config`'s fields that declare a flag (those of `only`, else all) in place of the command's
    `parameter`, which gets the values given as a dict of `config` keywords (an option not given is absent)."""
    options = declared_options(config)
    unknown = sorted(set(only or ()) - set(options))
    if unknown:
        raise ValueError(f"{config.__name__} declares no flag for {', '.join(unknown)}")
    without = () if only is None else tuple(name for name in options if name not in only)
    return takes_group(options, parameter, given_values, without)
