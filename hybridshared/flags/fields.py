"""Dataclass fields as command-line flags: a field's metadata holds its flag names, help, type and choices, so one
dataclass is both the parsed options and the source of the argparse parser (`add_flags`), and says which engine
option each field sets (`Flag.engine`), so the engine's options are derived from it without a hand-written mapping.

No torch, no runtime imports: `hybridshared.flags.runtime_parser` builds the parser of `python -m runtime` from this.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

SAME_NAME = "<same name>"  # Flag.engine's default: the engine option of the field's own name


@dataclasses.dataclass(frozen=True)
class Flag:
    """How one option field appears on the command line and what it sets in the engine."""

    names: tuple[str, ...]  # option strings, the primary (documented) name first
    help: str | None = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    group: str | None = None  # argparse group title; None: the parser's main options
    metavar: str | None = None
    # The engine option this field sets (None: used by the server only); None values are left to the engine's
    # default, exactly as SGLang's None means "derive it".
    engine: str | None = SAME_NAME
    to_engine: Callable[[Any], Any] | None = None  # converts the parsed value to the engine's (e.g. negation)


def flag(
    *names: str,
    default: Any = None,
    required: bool = False,
    help: str | None = None,  # noqa: A002 - argparse's own keyword
    type: Callable[[str], Any] | None = None,  # noqa: A002 - argparse's own keyword
    choices: tuple[str, ...] | None = None,
    group: str | None = None,
    metavar: str | None = None,
    engine: str | None = SAME_NAME,
    to_engine: Callable[[Any], Any] | None = None,
) -> Any:
    """A dataclass field that is also a flag. A required flag is a field without a default; a bool field that
    defaults to False is a switch (store_true)."""
    spec = Flag(names, help, type, choices, group, metavar, engine, to_engine)
    return dataclasses.field(default=dataclasses.MISSING if required else default, metadata={"flag": spec})


def flag_fields(cls: type) -> Iterator[tuple[dataclasses.Field[Any], Flag]]:
    """(field, its Flag) for every flag field of dataclass `cls`, in declaration order."""
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("flag")
        if isinstance(spec, Flag):
            yield f, spec


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """One argparse argument per flag field of `cls`, in declaration order, groups created as first met."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f, spec in flag_fields(cls):
        target: argparse.ArgumentParser | argparse._ArgumentGroup = parser
        if spec.group is not None:
            target = groups.get(spec.group) or groups.setdefault(spec.group, parser.add_argument_group(spec.group))
        kwargs: dict[str, Any] = {"dest": f.name, "help": spec.help}
        if f.default is dataclasses.MISSING:
            kwargs["required"] = True
        elif f.default is False:
            kwargs.update(action="store_true")
        else:
            kwargs["default"] = f.default
        if spec.type is not None:
            kwargs["type"] = spec.type
        if spec.choices is not None:
            kwargs["choices"] = spec.choices
        if spec.metavar is not None:
            kwargs["metavar"] = spec.metavar
        target.add_argument(*spec.names, **kwargs)


def group_flags(cls: type, group: str) -> tuple[str, ...]:
    """The primary names of the flags of one group, in declaration order."""
    return tuple(spec.names[0] for _, spec in flag_fields(cls) if spec.group == group)


def engine_targets(cls: type) -> dict[str, str]:
    """Field name -> the engine option it sets, for every field that sets one."""
    out: dict[str, str] = {}
    for f, spec in flag_fields(cls):
        if spec.engine is not None:
            out[f.name] = f.name if spec.engine == SAME_NAME else spec.engine
    return out


def engine_values(options: object) -> dict[str, Any]:
    """The engine options set by the dataclass instance `options`: converted, None values left out."""
    targets = engine_targets(type(options))
    specs = {f.name: spec for f, spec in flag_fields(type(options))}
    out: dict[str, Any] = {}
    for name, target in targets.items():
        value = getattr(options, name)
        if value is None:
            continue
        convert = specs[name].to_engine
        out[target] = convert(value) if convert is not None else value
    return out
