"""SGLANG_RELEASE_*: what the target SGLang release refuses or silently changes, from its own flag data.

Every flag `launch` would pass for the config is looked up in that release's flag table (hybridshared/data, dumped
from the release's own parser by scripts/regen_sglang_flags.py): a flag the release lacks or a value outside its
choices is an error naming the release and the fix (the accepted value, or the first release that has the flag),
so `validate` refuses before SGLang's parser would. Behaviour the release's server-args post-processing changes
without an error (recorded per release as facts) is a warning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from hybridctl.config.findings import CONFIG, Finding, json_set, rule_finding, toml_set
from hybridctl.config.schema import HybridConfig
from hybridctl.launch.mapping import ROWS
from hybridctl.launch.translate import LaunchError, translate
from hybridctl.model.bundled import bundled_stand_in
from hybridshared.flags.engine_flags import (
    DEFAULT_SGLANG_VERSION,
    available_versions,
    first_release_with,
    nearest_version,
    release_facts,
    sglang_flags,
)
from hybridshared.flags.sglang_version import VersionError, resolve_release, version_key
from hybridshared.units import format_value

if TYPE_CHECKING:  # launch/ imports config/ at load time; config/ imports launch/ only inside rule_release
    from hybridctl.launch.translate import Translation


def release_for(cfg: HybridConfig, engine_version: str | None) -> str:
    """The release the rules judge, in resolve_release's one order (flag, installed sglang, config key, newest)."""
    return resolve_release(engine_version, cfg.config.server.sglang_version, DEFAULT_SGLANG_VERSION)[0]


def _set(file: str, key: str, value: str) -> str:
    return toml_set(key, value) if file == CONFIG else json_set(key, value)


def rule_release(cfg: HybridConfig, engine_version: str | None = None) -> list[Finding]:
    """SGLANG_RELEASE_FLAG / SGLANG_RELEASE_VALUE (errors) and SGLANG_RELEASE_CHANGES (warnings)."""
    if cfg.config.server.engine == "builtin":
        return []

    version = release_for(cfg, engine_version)
    try:
        version_key(version)
        translation = translate(cfg, "sglang", version)
    except (VersionError, LaunchError):
        return []  # an unreadable version or an untranslatable config: other checks name those
    table_version = nearest_version(version)
    out = []
    if version not in available_versions() and not cfg.config.extra_engine_args:
        out.append(_no_table(version, table_version))  # with extra args, ENGINE_VERSION_UNKNOWN says it
    table = sglang_flags(table_version)
    by_option = {opt: info for info in table.values() for opt in (info.name, *info.aliases)}
    for flag, value in translation.flags.items():
        file, _, key = translation.sources.get(flag, f"{CONFIG}:").partition(":")
        info = by_option.get(flag)
        if info is None:
            since = first_release_with(flag)
            need = f"needs SGLang >= {since}" if since else "no held SGLang release has it"
            out.append(
                rule_finding(
                    "error",
                    "SGLANG_RELEASE_FLAG",
                    file,
                    key,
                    f"SGLang {version} has no {flag} ({need}); its parser would refuse the launch command.",
                    f"upgrade SGLang to {since} or later (--sglang-version {since} of validate, plan and launch "
                    f"judges for it), or leave {key} at its default"
                    if since
                    else f"leave {key} at its default",
                )  # fmt: skip
            )
        elif info.choices and value not in info.choices:
            good = _closest(value or "", info.choices)
            newer = [v for v in available_versions() if value in sglang_flags(v).get(info.name, info).choices]
            later = f", or SGLang >= {newer[0]}" if newer and version_key(newer[0]) > version_key(version) else ""
            out.append(
                rule_finding(
                    "error",
                    "SGLANG_RELEASE_VALUE",
                    file,
                    key,
                    f"SGLang {version}'s {flag} accepts {', '.join(info.choices)}, not {format_value(value)}.",
                    f"{_set(file, key, repr(good).replace(chr(39), chr(34)))}{later}",
                )  # fmt: skip
            )
    out += _gated_keys(cfg, translation, version)
    out += _silent_changes(cfg, version)
    return out


def _gated_keys(cfg: HybridConfig, translation: Translation, version: str) -> list[Finding]:
    """SGLANG_RELEASE_KEY: a key set to a value only other releases have a flag for (launch would refuse it)."""

    rows = {row.key: row for row in ROWS}
    out = []
    for ignored in translation.ignored:
        row = rows.get(ignored.key)
        if row is None:
            continue
        newer = sorted(
            (t.since for t in row.sglang if t.status == "flag" and t.since and t.accepts(ignored.value, cfg)
             and version_key(t.since) > version_key(version)),
            key=version_key,
        )  # fmt: skip
        if not newer:
            continue  # not a matter of the release: the engine has no equivalent at all (other rules say so)
        out.append(
            rule_finding(
                "error",
                "SGLANG_RELEASE_KEY",
                ignored.file,
                ignored.key,
                f"SGLang {version} has no flag for {ignored.key} = {format_value(ignored.value)} "
                f"(needs SGLang >= {newer[0]}); "
                "launch would refuse to start it rather than let SGLang ignore it.",
                f"leave {ignored.key} at its default, or target SGLang {newer[0]} or later (--sglang-version "
                f"{newer[0]} of validate, plan and launch, or server.sglang_version)",
            )  # fmt: skip
        )
    return out


def _closest(value: str, choices: tuple[str, ...]) -> str:
    """The accepted value most like the refused one (float16 -> bfloat16: the longest shared ending)."""

    def shared_ending(choice: str) -> int:
        n = 0
        while n < min(len(choice), len(value)) and choice[-1 - n] == value[-1 - n]:
            n += 1
        return n

    return max((c for c in choices if c != "auto"), key=shared_ending, default=choices[0])


def _no_table(version: str, table_version: str) -> Finding:
    return rule_finding(
        "warning", "SGLANG_RELEASE_UNCHECKED", CONFIG, "server.sglang_version",
        f"hybridctl holds no flag table for SGLang {version}; its flags and values were checked against "
        f"{table_version}'s, the nearest older release it holds.",
        "target a held release (server.sglang_version, or --sglang-version of validate, plan and launch; held: "
        + ", ".join(available_versions()) + ")",
    )  # fmt: skip


def model_architecture(cfg: HybridConfig) -> str | None:
    """architectures[0] of the model's config.json when server.model_path is a local directory (or a checkpoint
    this host does not hold whose config.json hybridctl bundles), else None."""

    bundled = bundled_stand_in(cfg.config.server.model_path or "")
    path = bundled.config_json if bundled else Path(cfg.config.server.model_path or "") / "config.json"
    try:
        archs = json.loads(path.read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return None
    return str(archs[0]) if isinstance(archs, list) and archs else None


def _affected(cfg: HybridConfig, archs: list[str]) -> str | None:
    """Who the release's behaviour hits: the model's architecture, "X or Y models" when unknown, None: not it."""
    if not archs:
        return None
    arch = model_architecture(cfg)
    if arch is not None:
        return arch if arch in archs else None
    return f"{' or '.join(archs)} models"


def _silent_changes(cfg: HybridConfig, version: str) -> list[Finding]:
    """SGLANG_RELEASE_CHANGES: what the release's server-args post-processing changes without an error."""
    facts = release_facts(version)
    if not cfg.prefix_cache_enabled:
        return []
    out = []
    overlap = _affected(cfg, list(facts.get("radix_cache_disables_overlap_for", [])))
    if overlap:
        out.append(
            rule_finding(
                "warning",
                "SGLANG_RELEASE_CHANGES",
                CONFIG,
                "cache.enable_prefix_caching",
                f"SGLang {version} turns the overlap schedule off for {overlap} whenever the Mamba radix cache "
                "is on (MambaRadixCache was not compatible with it yet); `plan --sglang-version` sizes for that.",
                "accept it, target a release that keeps it, or "
                + toml_set("cache.enable_prefix_caching", "false")
                + " to keep the overlap schedule",
            )
        )
    if facts.get("pool_sizing_code") == "model_runner" and cfg.config.memory.max_mamba_cache_size is not None:
        # model_runner.py handle_max_mamba_cache: with the radix cache on, K always comes from the ratio
        out.append(
            rule_finding(
                "warning",
                "SGLANG_RELEASE_CHANGES",
                CONFIG,
                "memory.max_mamba_cache_size",
                f"SGLang {version} recomputes max_mamba_cache_size from mamba_full_memory_ratio whenever the radix "
                f"cache is on, so {cfg.config.memory.max_mamba_cache_size} is not what runs.",
                "steer the state pool with memory.mamba_full_memory_ratio for this release, or target 0.5.7 or later",
            )
        )
    radix = _affected(cfg, list(facts.get("radix_cache_disabled_for", [])))
    if radix:
        out.append(
            rule_finding(
                "warning",
                "SGLANG_RELEASE_CHANGES",
                CONFIG,
                "cache.enable_prefix_caching",
                f"SGLang {version} turns the radix cache off for {radix} (not supported there yet): no prefix "
                "caching although enable_prefix_caching = true.",
                "target a release that supports it (see docs/sglang-releases.md), or set "
                "enable_prefix_caching = false to say what runs",
            )
        )
    return out
