"""Check `[extra_engine_args]` against the engine's real flag table (SGLang 0.5.23's argparse dump)."""

from __future__ import annotations

import difflib

from hybridctl.config.findings import CONFIG, Finding, rule_finding
from hybridctl.config.schema import HybridConfig
from hybridctl.launch.builtin_flags import RUNTIME_FLAGS
from hybridctl.launch.command import SECRET_FLAGS
from hybridctl.launch.mapping import ROWS
from hybridshared.flags.engine_flags import (
    DEFAULT_SGLANG_VERSION,
    FlagInfo,
    available_versions,
    nearest_version,
    sglang_flags,
)
from hybridshared.units import format_value

# Flags renamed between versions: old name -> (new name, the config key that sets it).
RENAMED_FLAGS = {"--mamba-scheduler-strategy": ("--mamba-radix-cache-strategy", "cache.mamba_radix_cache_strategy")}


def _value_problem(info: FlagInfo, value: object) -> str | None:
    if not info.takes_value:
        if value is not True:
            return f"{info.name} is a switch (no value); write `true` to pass it, or leave it out"
        return None
    if info.choices and str(value) not in info.choices:
        return f"{info.name} accepts {', '.join(info.choices)}, not {format_value(value)}"
    if isinstance(value, bool):
        return f"{info.name} takes a {info.type or 'value'}, not a boolean"
    if info.type == "int" and not isinstance(value, int):
        try:
            int(str(value))
        except ValueError:
            return f"{info.name} takes an integer, not {format_value(value)}"
    if info.type == "float" and not isinstance(value, int | float):
        try:
            float(str(value))
        except ValueError:
            return f"{info.name} takes a number, not {format_value(value)}"
    return None


def _config_homes(engine: str, version: str) -> dict[str, str]:
    """Engine flag -> the config key that sets it, from launch's mapping table (the one source)."""

    homes = {}
    for row in ROWS:
        target = row.builtin if engine == "builtin" else row.sglang_target(version)
        if target.status == "flag" and target.flag:
            section, name = row.key.rsplit(".", 1)
            homes[target.flag] = (
                f"{name} in [{section}] of {row.file}"
                if row.file == CONFIG
                else f'"{name}" in the "{section}" object of {row.file}'
            )
    return homes


def _builtin_flags() -> dict[str, FlagInfo]:
    """The bundled runtime's flags as launch knows them (a launch test checks them against
    hybridshared/flags/runtime_args.py)."""

    return {
        name: FlagInfo(
            name=name,
            dest=name.lstrip("-").replace("-", "_"),
            type=None,
            default=None,
            choices=tuple(spec.choices),
            action="StoreAction" if spec.takes_value else "StoreTrueAction",
        )
        for name, spec in RUNTIME_FLAGS.items()
    }


def _lookup(flags: dict[str, FlagInfo], key: str) -> FlagInfo | None:
    bare = key.strip().lstrip("-")
    for candidate in (f"--{bare}", f"--{bare.replace('_', '-')}"):
        if candidate in flags:
            return flags[candidate]
        for info in flags.values():
            if candidate in info.aliases:
                return info
    return None


def check_extra_engine_args(
    cfg: HybridConfig, engine_version: str | None = None, engine: str | None = None
) -> list[Finding]:
    """`engine`: the resolved engine (sglang | builtin); None: [server] engine, "auto" checked as SGLang."""
    args = cfg.config.extra_engine_args
    if not args:
        return []
    engine = engine or cfg.config.server.engine
    flags, label, version, out = _flag_table(engine, engine_version or DEFAULT_SGLANG_VERSION)
    homes = _config_homes(engine, version)
    for key, value in args.items():
        flag = "--" + key.lstrip("-")
        if flag in RENAMED_FLAGS and engine != "builtin":
            out.append(_renamed(key, flag, version))
            continue
        info = _lookup(flags, key)
        if info is None:
            out.append(_unknown(key, flags, label))
            continue
        out += _known_flag_findings(key, value, info, homes)
    return out


def _flag_table(engine: str, version: str) -> tuple[dict[str, FlagInfo], str, str, list[Finding]]:
    """The flags the engine takes, its name for messages, the SGLang table version, and a warning if estimated."""
    if engine == "builtin":
        return _builtin_flags(), "the bundled runtime (python -m runtime)", version, []
    out: list[Finding] = []
    if version not in available_versions():
        table_version = nearest_version(version)
        out.append(
            rule_finding(
                "warning",
                "ENGINE_VERSION_UNKNOWN",
                CONFIG,
                "extra_engine_args",
                f"no SGLang {version} flag table in hybridctl; [extra_engine_args] checked against {table_version}.",
                f"target {table_version} (--sglang-version {table_version} of validate, plan and launch), or "
                "regenerate the table with "
                "scripts/regen_sglang_flags.py.",
            )
        )
        version = table_version
    return sglang_flags(version), f"SGLang {version}'s launch_server", version, out


def _renamed(key: str, flag: str, version: str) -> Finding:
    new, home = RENAMED_FLAGS[flag]
    section, name = home.split(".")
    return rule_finding(
        "error",
        "UNKNOWN_ENGINE_FLAG",
        CONFIG,
        f"extra_engine_args.{key}",
        f"{flag} was renamed to {new}; SGLang {version} refuses the old name.",
        f"remove `{key}` from [extra_engine_args] and set {name} in [{section}] of {CONFIG}.",
    )


def _unknown(key: str, flags: dict[str, FlagInfo], label: str) -> Finding:
    names = [n.lstrip("-") for n in flags]
    close = difflib.get_close_matches(key.lstrip("-").replace("_", "-"), names, n=1, cutoff=0.7)
    hint = f"rename `{key}` to `{close[0]}`" if close else f"remove `{key}`"
    return rule_finding(
        "error",
        "UNKNOWN_ENGINE_FLAG",
        CONFIG,
        f"extra_engine_args.{key}",
        f"`{key}` is not a flag of {label}; the server would refuse to start.",
        f"{hint} in [extra_engine_args] of {CONFIG}.",
    )


def _known_flag_findings(key: str, value: object, info: FlagInfo, homes: dict[str, str]) -> list[Finding]:
    """A flag the engine has: a value it refuses, a secret on the command line, or a flag a config key sets."""

    dotted = f"extra_engine_args.{key}"
    out: list[Finding] = []
    problem = _value_problem(info, value)
    if problem:
        out.append(
            rule_finding(
                "error",
                "ENGINE_FLAG_VALUE",
                CONFIG,
                dotted,
                problem + ".",
                f"correct `{key}` in [extra_engine_args] of {CONFIG}.",
            )
        )
    if info.name in SECRET_FLAGS:
        out.append(
            rule_finding(
                "error",
                "LITERAL_SECRET",
                CONFIG,
                dotted,
                f"{info.name} would put a secret in a config file (and on a command line); launch refuses it.",
                f"remove `{key}` from [extra_engine_args]; keep keys in environment variables.",
            )
        )
    elif info.name in homes:
        out.append(
            rule_finding(
                "error",
                "ENGINE_FLAG_SHADOWS_KEY",
                CONFIG,
                dotted,
                f"{info.name} is set from a config key; passing it here too gives one value two sources, "
                "and launch refuses it.",
                f"remove `{key}` from [extra_engine_args] and set {homes[info.name]}.",
            )
        )
    return out
