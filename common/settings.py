"""Settings declared once: a dataclass field made with :func:`setting` carries its help text, bounds, choices, its
command-line flag and whether an HTTP request may set it (:class:`Setting`); its type is the field's annotation.
The command line, the HTTP API and the demo build their options from these declarations (:func:`declared_settings`),
and :func:`check_setting` is the one check of a value, wherever it comes from."""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass
from typing import Any

from medfaq.common.runtime import MedfaqError

METADATA_KEY = "setting"


@dataclass(frozen=True)
class Setting:
    """How one field may be set.

    `help`: one line for the user. `flag`: it has a command-line option, named as the field (:attr:`Declared.flag`,
    ``--top-k`` for ``top_k``; a bool's becomes ``--x/--no-x``), or as the text given spells it (a bool's may spell
    both switches, ``--freeze-embeddings/--train-embeddings``); `aliases`: older spellings of that option, still
    accepted but not shown. `choices`: the values a text setting allows. `ge` / `gt`: a number's lower bound (at
    least / above); `le`: its upper bound (at most). `request`: an HTTP request may set it for itself.
    `needs_key`: a request that sets it sends its abstained questions to the experts' queue only when it carries the
    API key (the setting changes what gets queued)."""

    help: str
    flag: bool | str = False
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    request: bool = False
    needs_key: bool = False


@dataclass(frozen=True)
class Declared:
    """A declared field: its `name`, its value's type `kind` (bool, int, float, str or dict), whether None is
    allowed (`optional`), its `default` and its :class:`Setting`."""

    name: str
    kind: type
    optional: bool
    default: Any
    setting: Setting

    @property
    def label(self) -> str:
        return self.name.replace("_", " ")

    @property
    def flag(self) -> str | None:
        """Its command-line option, the field's name with hyphens (``--top-k``) unless the declaration spells it;
        None when it has none."""
        if isinstance(self.setting.flag, str):
            return self.setting.flag
        return "--" + self.name.replace("_", "-") if self.setting.flag else None

    def limits(self) -> str:
        """Its choices (``raw|summary|both``) or a number's bounds in words (``at least 1 and at most 100``, ``above
        0``); empty when it has none."""
        rule = self.setting
        low = f"at least {rule.ge:g}" if rule.ge is not None else f"above {rule.gt:g}" if rule.gt is not None else ""
        high = f"at most {rule.le:g}" if rule.le is not None else ""
        return "|".join(rule.choices) or " and ".join(filter(None, (low, high)))

    def describe(self) -> str:
        """The help text, with its limits when it has any."""
        limits = self.limits()
        return f"{self.setting.help} ({limits})" if limits else self.setting.help


def setting(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, **declared: Any) -> Any:
    """A dataclass field declared with a :class:`Setting` (`declared`: its arguments)."""
    metadata = {METADATA_KEY: Setting(**declared)}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


@functools.cache
def declared_settings(cls: type) -> dict[str, Declared]:
    """The fields of the dataclass `cls` declared with :func:`setting`, in their order."""
    hints = typing.get_type_hints(cls)
    found = {}
    for field in dataclasses.fields(cls):
        if METADATA_KEY not in field.metadata:
            continue
        hint = hints[field.name]
        optional = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        kind = next(arg for arg in typing.get_args(hint) if arg is not type(None)) if optional else hint
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        found[field.name] = Declared(
            field.name, typing.get_origin(kind) or kind, optional, default, field.metadata[METADATA_KEY]
        )
    return found


def check_setting(declared: Declared, value: Any) -> None:
    """A one-line :class:`MedfaqError` unless `value` is of the declared type (no bool for a number, no text for
    a number, no number for a bool), within its bounds and among its choices."""
    if value is None and declared.optional:
        return
    name, rule = declared.name, declared.setting
    if declared.kind is bool and not isinstance(value, bool):
        raise MedfaqError(f"{name} must be true or false, got {value!r}")
    if declared.kind in (int, float):
        whole = declared.kind is int
        kinds = int if whole else int | float
        number_ok = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
        if not (number_ok and _within(rule, value)):
            what = "a whole number" if whole else "a finite number"
            limits = declared.limits()
            bounds = f" of {limits}" if limits.startswith("at ") else f" {limits}" if limits else ""
            raise MedfaqError(f"{name} must be {what}{bounds}, got {value!r}")
    if declared.kind is str and not isinstance(value, str):
        raise MedfaqError(f"{name} must be text, got {value!r}")
    if rule.choices and value not in rule.choices:
        raise MedfaqError(f"unknown {declared.label} {value!r}; choose one of {', '.join(rule.choices)}")
    if declared.kind is dict and not isinstance(value, dict):
        raise MedfaqError(f"{name} must be an object, got {value!r}")


def _within(rule: Setting, number: float) -> bool:
    return (
        (rule.ge is None or number >= rule.ge)
        and (rule.gt is None or number > rule.gt)
        and (rule.le is None or number <= rule.le)
    )
