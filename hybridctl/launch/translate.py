"""Config -> engine flags through the mapping table, for either engine, plus the keys the engine would ignore.

The result is data (`Translation`); builtin_flags.py and sglang_command.py turn it into a command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from hybridctl.config.schema import HybridConfig
from hybridctl.launch.mapping import ROWS
from hybridctl.launch.mapping_row import MappingRow, Target, config_value

Engine = Literal["sglang", "builtin"]
# A flag's value on the command line; SWITCH (None) for a flag without one. Not "": an empty value such as
# `host = ""` is still a value, and must stay an (empty) argument instead of vanishing from the command.
Flags = dict[str, str | None]
SWITCH = None


@dataclass(frozen=True)
class IgnoredKey:
    """A key set to a value the engine cannot honour: it would be silently ignored if launched."""

    file: str
    key: str
    value: Any
    engine: Engine
    reason: str

    def describe(self) -> str:
        return f"{self.file} {self.key} = {self.value!r}: {self.reason}"


@dataclass
class Translation:
    engine: Engine
    version: str | None  # SGLang version the flags are written for; None for the bundled runtime
    # flag -> value (SWITCH for a switch); insertion order is the order on the command line
    flags: Flags = field(default_factory=dict)
    ignored: list[IgnoredKey] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # flag -> the config key it came from


class LaunchError(Exception):
    """A config that cannot be launched as asked; the message names the file, key and fix."""


def render_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _emit(out: Translation, row: MappingRow, target: Target, value: Any) -> None:
    assert target.flag is not None
    if target.kind == "value":
        if value is None:
            return
        out.flags[target.flag] = render_value(value)
    elif (target.kind == "true" and value) or (target.kind == "false" and not value):
        out.flags[target.flag] = SWITCH
    else:
        return
    out.sources.setdefault(target.flag, row.qualified)


def _reason(row: MappingRow, target: Target, engine: Engine, version: str | None) -> str:
    name = f"SGLang {version}" if engine == "sglang" else "the bundled runtime"
    if target.status == "built-in":
        return f"{name} always behaves as the default here and has no switch ({target.note})"
    if target.status == "flag":
        return f"{name} does not take this value for {target.flag} ({target.note or 'unsupported value'})"
    return f"{name} has no equivalent ({target.note})" if target.note else f"{name} has no equivalent"


# Keys whose flags are placed by a dedicated builder (PD roles), not written into the single-server command.
_PLACED_ELSEWHERE = {
    "pd.enable_pd_disaggregation",
    "pd.prefill_port",
    "pd.decode_port",
    "pd.bootstrap_port",
    "extra_engine_args",
}


def translate(cfg: HybridConfig, engine: Engine, version: str | None = None) -> Translation:
    """Every mapped key's flags for `engine` (SGLang: as of `version`) and every key it would ignore."""
    out = Translation(engine=engine, version=version)
    for row in ROWS:
        if not row.when(cfg):
            continue
        value = config_value(cfg, row)
        target = row.sglang_target(version or "") if engine == "sglang" else row.builtin
        if target.status == "client-side":
            continue
        if not target.accepts(value, cfg):
            out.ignored.append(
                IgnoredKey(row.file, row.key, value, engine, _reason(row, target, engine, version))
            )
            continue
        if target.status == "flag" and row.key not in _PLACED_ELSEWHERE:
            _emit(out, row, target, value)
    _no_buffer_needs_no_overlap(cfg, out)
    return out


def _no_buffer_needs_no_overlap(cfg: HybridConfig, out: Translation) -> None:
    # SGLang asserts no_buffer runs without overlap scheduling instead of turning overlap off for an explicit
    # no_buffer (arg_groups/mamba_hook.py validate_mamba_no_buffer); the runtime accepts the flag as a no-op.
    if cfg.config.cache.mamba_radix_cache_strategy == "no_buffer" and cfg.prefix_cache_enabled:
        out.flags["--disable-overlap-schedule"] = SWITCH
        out.sources["--disable-overlap-schedule"] = "config.toml:cache.mamba_radix_cache_strategy"


def refuse_ignored(translation: Translation, allow_ignored: bool) -> None:
    """Raise LaunchError listing every ignored key, unless the user accepted them with --allow-ignored."""
    if allow_ignored or not translation.ignored:
        return
    engine = "SGLang" if translation.engine == "sglang" else "the bundled runtime"
    lines = "\n".join(f"  - {item.describe()}" for item in translation.ignored)
    raise LaunchError(
        f"{engine} would silently ignore {len(translation.ignored)} setting(s):\n{lines}\n"
        "Fix: set these keys back to their defaults (or remove them), choose the other engine with --engine, "
        "or pass --allow-ignored to launch anyway."
    )
