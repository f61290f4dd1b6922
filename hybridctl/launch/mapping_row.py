"""The shape of one row of the key -> engine flag table (mapping.py holds the rows themselves).

A `Target` says what one engine does with a key; a `MappingRow` pairs a config key with its SGLang targets (by
version range) and its bundled-runtime target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from hybridctl.config.schema import HybridConfig
from hybridshared.flags.sglang_version import in_range, version_key

Status = Literal["flag", "built-in", "not-supported", "client-side"]
# How a value becomes argv: "value" = --flag VALUE (skipped when None), "true" = --flag when truthy,
# "false" = --flag when falsy (enable_x = false -> --disable-x).
Kind = Literal["value", "true", "false"]

Accepts = Callable[[Any, HybridConfig], bool]


def _always(_value: Any, _cfg: HybridConfig) -> bool:
    return True


@dataclass(frozen=True)
class Target:
    status: Status
    flag: str | None = None
    kind: Kind = "value"
    since: str | None = None  # first SGLang release with this flag (inclusive)
    until: str | None = None  # first release without it (exclusive)
    # flag: values the engine can take; built-in / not-supported: values it honours anyway (no flag needed).
    accepts: Accepts = _always
    note: str = ""

    def applies_to(self, version: str | None) -> bool:
        return version is None or in_range(version, self.since, self.until)


@dataclass(frozen=True)
class MappingRow:
    file: Literal["config.toml", "settings.json"]
    key: str  # dotted within the file: "memory.mem_fraction_static"
    sglang: tuple[Target, ...]  # alternatives by version range; the first that applies wins
    builtin: Target
    # Only consulted when this holds (e.g. speculative keys only with an algorithm): else the key is moot.
    when: Callable[[HybridConfig], bool] = field(default=lambda _cfg: True)

    @property
    def qualified(self) -> str:
        return f"{self.file}:{self.key}"

    def sglang_target(self, version: str) -> Target:
        for target in self.sglang:
            if target.applies_to(version):
                return target
        first = min((t.since for t in self.sglang if t.since), key=version_key, default=None)
        return Target(
            "not-supported",
            accepts=is_default(self),
            note=f"no flag before SGLang {first}" if first else "no flag in this SGLang version",
        )


def config_value(cfg: HybridConfig, row: MappingRow) -> Any:
    node: Any = cfg.config if row.file == "config.toml" else cfg.settings
    for part in row.key.split("."):
        node = getattr(node, part)
    return node


def default_value(row: MappingRow) -> Any:
    return config_value(HybridConfig(), row)


def is_default(row: MappingRow) -> Accepts:
    return lambda value, _cfg: value == default_value(row)


def flag(flag: str, kind: Kind = "value", **kw: Any) -> Target:
    return Target("flag", flag, kind, **kw)


def equals(*values: Any) -> Accepts:
    return lambda value, _cfg: value in values
