"""Config -> engine flags through the mapping table, for either engine, plus the keys the engine would ignore.

The result is data (`Translation`); builtin_flags.py and sglang.py turn it into a command line.

`engine_findings` turns the same translation into what `validate` and `doctor` print: keys the engine would
ignore (IGNORED_BY_ENGINE, a warning: `launch` refuses them without --allow-ignored) and keys it names
differently (ENGINE_NAME, info: `memory.enable_elastic_memory_pool` is SGLang's `--enable-unified-memory`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal

from hybridctl.config.findings import Finding
from hybridctl.config.schema import HybridConfig
from hybridctl.launch.mapping import ROWS
from hybridctl.launch.mapping_row import MappingRow, Target, config_value
from hybridshared.flags.engine_flags import DEFAULT_SGLANG_VERSION
from hybridshared.flags.sglang_version import resolve_release
from hybridshared.units import format_value

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
        # The value as the file spells it (true, "fcfs"), not as Python prints it (True, 'fcfs').
        return f"{self.file} {self.key} = {format_value(self.value)}: {self.reason}"


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
            out.ignored.append(IgnoredKey(row.file, row.key, value, engine, _reason(row, target, engine, version)))
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


def _logical(source: str) -> tuple[str, str]:
    file, _, key = source.partition(":")
    return file, key


def engine_findings(
    cfg: HybridConfig, engine: str | None, version: str | None, present: Collection[str] = ()
) -> list[Finding]:
    """Findings about `cfg` as `engine` (sglang | builtin; None: nothing to say) would run it.

    `present`: dotted keys written in the files; only those get an ENGINE_NAME note (defaults need none)."""
    if engine not in ("sglang", "builtin"):
        return []
    version = target_version(version) if engine == "sglang" else None
    translation = translate(cfg, engine, version)  # type: ignore[arg-type]
    name = f"SGLang {version}" if engine == "sglang" else "the bundled runtime"
    out = [
        Finding(
            "warning",
            "IGNORED_BY_ENGINE",
            item.file,
            None,
            None,
            item.key,
            f"{item.key} = {format_value(item.value)} would be ignored: {item.reason}; `launch` refuses it unless "
            "--allow-ignored.",
            f"remove {item.key} from {item.file} (or set it back to its default), or serve with the other engine",
        )
        for item in translation.ignored
    ]
    for flag, source in translation.sources.items():
        file, key = _logical(source)
        if key not in present or key.startswith("extra_engine_args"):
            continue
        if flag == "--" + key.rsplit(".", 1)[-1].replace("_", "-"):
            continue  # the same name: nothing to tell
        out.append(
            Finding(
                "info",
                "ENGINE_NAME",
                file,
                None,
                None,
                key,
                f"{key} is {flag} to {name}.",
                "",
            )
        )
    return out


def target_version(requested: str | None = None, configured: str | None = None) -> str:
    """The version commands are written for, in resolve_release's one order: the one asked for, the installed
    one, config.toml's server.sglang_version, else the newest held."""
    return resolve_release(requested, configured, DEFAULT_SGLANG_VERSION)[0]
