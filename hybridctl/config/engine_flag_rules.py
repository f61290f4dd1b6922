"""Check `[extra_engine_args]` against the engine's real flag table (SGLang 0.5.23's argparse dump)."""

from __future__ import annotations

import difflib

from hybridctl.config.engine_flags import (
    DEFAULT_SGLANG_VERSION,
    FlagInfo,
    available_versions,
    find_flag,
    nearest_version,
    sglang_flags,
)
from hybridctl.config.field_docs import all_key_names
from hybridctl.config.findings import Finding
from hybridctl.config.schema import ConfigToml, HybridConfig, SettingsJson

CONFIG = "config.toml"
# Flags renamed between versions: old name -> (new name, the config key that sets it).
RENAMED_FLAGS = {
    "--mamba-scheduler-strategy": ("--mamba-radix-cache-strategy", "cache.mamba_radix_cache_strategy")
}


def _value_problem(info: FlagInfo, value: object) -> str | None:
    if not info.takes_value:
        if value is not True:
            return f"{info.name} is a switch (no value); write `true` to pass it, or leave it out"
        return None
    if info.choices and str(value) not in info.choices:
        return f"{info.name} accepts {', '.join(info.choices)}, not {value!r}"
    if isinstance(value, bool):
        return f"{info.name} takes a {info.type or 'value'}, not a boolean"
    if info.type == "int" and not isinstance(value, int):
        try:
            int(str(value))
        except ValueError:
            return f"{info.name} takes an integer, not {value!r}"
    if info.type == "float" and not isinstance(value, int | float):
        try:
            float(str(value))
        except ValueError:
            return f"{info.name} takes a number, not {value!r}"
    return None


def _schema_homes() -> dict[str, str]:
    """ServerArgs dest -> the config key with the same name, which is where it should be set."""
    homes = {}
    for model, file in ((ConfigToml, "config.toml"), (SettingsJson, "settings.json")):
        for name, paths in all_key_names(model).items():
            section = ".".join(paths[0][:-1])
            homes[name] = (
                f"{name} in [{section}] of {file}" if file == CONFIG else f'"{name}" in "{section}" of {file}'
            )
    return homes


def check_extra_engine_args(cfg: HybridConfig, engine_version: str | None = None) -> list[Finding]:
    args = cfg.config.extra_engine_args
    if not args or cfg.config.server.engine == "builtin":
        # The bundled runtime refuses unknown flags itself at launch (runtime/args.py); its table is not ours.
        return []
    out: list[Finding] = []
    version = engine_version or DEFAULT_SGLANG_VERSION
    if version not in available_versions():
        table_version = nearest_version(version)
        out.append(
            Finding(
                "warning",
                "ENGINE_VERSION_UNKNOWN",
                CONFIG,
                None,
                None,
                "extra_engine_args",
                f"no SGLang {version} flag table in hybridctl; [extra_engine_args] checked against "
                f"{table_version}.",
                f"pass --engine-version {table_version}, or regenerate the table with "
                "scripts/regen_sglang_flags.py.",
            )
        )
        version = table_version
    flags = sglang_flags(version)
    names = [n.lstrip("-") for n in flags]
    homes = _schema_homes()
    for key, value in args.items():
        dotted = f"extra_engine_args.{key}"
        flag = "--" + key.lstrip("-")
        if flag in RENAMED_FLAGS:
            new, home = RENAMED_FLAGS[flag]
            section, name = home.split(".")
            out.append(
                Finding(
                    "error",
                    "UNKNOWN_ENGINE_FLAG",
                    CONFIG,
                    None,
                    None,
                    dotted,
                    f"{flag} was renamed to {new}; SGLang {version} refuses the old name.",
                    f"remove `{key}` from [extra_engine_args] and set {name} in [{section}] of {CONFIG}.",
                )
            )
            continue
        info = find_flag(key, version)
        if info is None:
            close = difflib.get_close_matches(key.lstrip("-").replace("_", "-"), names, n=1, cutoff=0.7)
            hint = f"rename `{key}` to `{close[0]}`" if close else f"remove `{key}`"
            out.append(
                Finding(
                    "error",
                    "UNKNOWN_ENGINE_FLAG",
                    CONFIG,
                    None,
                    None,
                    dotted,
                    f"`{key}` is not a flag of SGLang {version}'s launch_server; the server would exit at "
                    "start-up.",
                    f"{hint} in [extra_engine_args] of {CONFIG}.",
                )
            )
            continue
        problem = _value_problem(info, value)
        if problem:
            out.append(
                Finding(
                    "error",
                    "ENGINE_FLAG_VALUE",
                    CONFIG,
                    None,
                    None,
                    dotted,
                    problem + ".",
                    f"correct `{key}` in [extra_engine_args] of {CONFIG}.",
                )
            )
        if info.dest in homes:
            out.append(
                Finding(
                    "warning",
                    "ENGINE_FLAG_SHADOWS_KEY",
                    CONFIG,
                    None,
                    None,
                    dotted,
                    f"{info.name} is set from a config key; passing it here too makes two sources for one "
                    "value.",
                    f"remove `{key}` from [extra_engine_args] and set {homes[info.dest]}.",
                )
            )
    return out
