"""Config -> `python -m sglang.launch_server ...` for a given SGLang version, and the same as `--config` YAML.

Flag names come from the mapping table; `extra_engine_args` are checked against the flag table dumped from that
version's real parser (hybridshared/data/sglang-<version>-flags.tsv; the nearest older table when there is none).

Which SGLang the commands target: the installed one, found from package metadata (importing sglang pulls in
CUDA-only packages and takes seconds), else the configured or newest release. Parsing and comparing release
numbers is hybridshared/flags/sglang_version.py; which flag exists since when is the mapping table's.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from functools import lru_cache

from hybridctl.config.schema import HybridConfig
from hybridctl.launch.command import (
    EngineCommand,
    FlagSpec,
    add_extra_args,
    flags_to_argv,
    multinode_problem,
    require_model_path,
)
from hybridctl.launch.translate import Flags, LaunchError, Translation, refuse_ignored, translate
from hybridshared.flags.engine_flags import nearest_version, sglang_flags

SGLANG_MODULE = "sglang.launch_server"


@lru_cache(maxsize=4)
def known_sglang_flags(version: str) -> dict[str, FlagSpec]:
    """Every option string of that version's launch_server (aliases too) -> its primary name and arity."""
    known: dict[str, FlagSpec] = {}
    for info in sglang_flags(nearest_version(version)).values():
        spec = FlagSpec(info.name, info.takes_value, info.choices)
        for option in (info.name, *info.aliases):
            known[option] = spec
    return known


def sglang_translation(cfg: HybridConfig, version: str, allow_ignored: bool = False) -> Translation:
    """The checked flags for one SGLang server of `cfg` (before any PD role flags)."""
    require_model_path(cfg)
    translation = translate(cfg, "sglang", version)
    refuse_ignored(translation, allow_ignored)
    add_extra_args(translation, cfg.config.extra_engine_args, known_sglang_flags(version), f"SGLang {version}")
    return translation


def check_multinode(cfg: HybridConfig) -> None:
    """A server spanning nodes needs node 0's address and a rank below the node count."""
    problem = multinode_problem(cfg)
    if problem is not None:  # the same check `validate` reports (MULTINODE)
        key, message, fix = problem
        raise LaunchError(f"config.toml [server] {message} Fix: {fix}.")


def sglang_argv(flags: Flags, python: str | None = None) -> list[str]:
    return [python or sys.executable, "-m", SGLANG_MODULE, *flags_to_argv(flags)]


def sglang_command(
    cfg: HybridConfig, version: str, python: str | None = None, allow_ignored: bool = False
) -> EngineCommand:
    """The single-server SGLang command for `cfg` (PD configs: see pd.py)."""
    check_multinode(cfg)
    translation = sglang_translation(cfg, version, allow_ignored)
    server = cfg.config.server
    return EngineCommand(
        engine="sglang", role="server", argv=sglang_argv(translation.flags, python), host=server.host,
        port=server.port, version=version, ignored=translation.ignored,
    )  # fmt: skip


def _yaml_scalar(value: str, flag_type: str | None) -> str:
    if flag_type in ("int", "float", "human_readable_int"):
        try:
            float(value)
            return value
        except ValueError:
            pass
    return json.dumps(value)  # a JSON string is a valid YAML double-quoted scalar


def to_config_yaml(flags: Flags, version: str) -> tuple[str, list[str]]:
    """SGLang's `--config` file for `flags`, and the flags that must stay on the command line.

    Keys are the flag names without the leading dashes (dashed, as SGLang requires); switches are `true`;
    BooleanOptionalAction flags are refused inside the file by SGLang, so they are returned to stay on argv.
    """
    table = sglang_flags(nearest_version(version))
    by_option = {opt: info for info in table.values() for opt in (info.name, *info.aliases)}
    lines = [f"# SGLang {version} server config written by hybridctl; run: python -m {SGLANG_MODULE} --config FILE"]
    leftover: Flags = {}
    for name, value in flags.items():
        info = by_option.get(name)
        if info is not None and info.action == "BooleanOptionalAction":
            leftover[name] = value
            continue
        key = name[2:]
        lines.append(f"{key}: true" if value is None else f"{key}: {_yaml_scalar(value, info.type if info else None)}")
    return "\n".join(lines) + "\n", flags_to_argv(leftover)


def installed_sglang_version(python: str | None = None) -> str | None:
    """The sglang version installed in this interpreter (or in `python`, e.g. a venv's), None when absent."""
    if python is None:
        try:
            return importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            return None
    probe = "import importlib.metadata as m\ntry: print(m.version('sglang'))\nexcept m.PackageNotFoundError: pass"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None
