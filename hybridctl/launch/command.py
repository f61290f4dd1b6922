"""What a command builder returns (a process: argv + where it answers), and the extra-args check."""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from hybridctl.config.findings import CONFIG, toml_set
from hybridctl.config.schema import HybridConfig, ScalarValue
from hybridctl.launch.translate import SWITCH, Engine, Flags, IgnoredKey, LaunchError, Translation, render_value
from hybridshared.units import format_value

Role = Literal["server", "prefill", "decode", "router"]

# Never from a file: a key in config.toml ends up in git, in logs and on screens.
SECRET_FLAGS = {"--api-key", "--admin-api-key"}


@dataclass(frozen=True)
class FlagSpec:
    """What the extra-args check needs to know about one engine flag."""

    name: str
    takes_value: bool
    choices: tuple[str, ...] = ()


@dataclass
class EngineCommand:
    engine: Engine
    role: Role
    argv: list[str]
    host: str
    port: int
    version: str | None = None  # SGLang version the flags were written for
    ignored: list[IgnoredKey] = field(default_factory=list)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return f"http://{host}:{self.port}"

    def shell(self) -> str:
        """One line a POSIX shell runs exactly as `argv`."""
        return shlex.join(self.argv)

    def to_dict(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "role": self.role,
            "argv": self.argv,
            "shell": self.shell(),
            "url": self.url,
            "version": self.version,
            "ignored": [i.describe() for i in self.ignored],
        }


def _normalize(name: str) -> str:
    return "--" + name.strip().lstrip("-").replace("_", "-")


def add_extra_args(
    translation: Translation,
    extra: Mapping[str, ScalarValue],
    known: Mapping[str, FlagSpec],
    engine_label: str,
) -> None:
    """Append `extra_engine_args` to the flags, each checked against the engine's flags.

    `known` is keyed by every option string. Unknown flags, secrets, values outside the choices and flags that
    a config key already sets raise LaunchError.
    """
    where = "config.toml [extra_engine_args]"
    for raw_name, value in extra.items():
        name = _normalize(raw_name)
        spec = known.get(name)
        if spec is None:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise LaunchError(
                f"{where}: {raw_name!r} is not a flag of {engine_label}. "
                f"Fix: {hint}remove it or correct the name (`hybridctl launch --dry-run` shows the command)."
            )
        name = spec.name
        if name in SECRET_FLAGS:
            raise LaunchError(
                f"{where}: {raw_name!r} would put a secret in a config file. "
                "Fix: remove it; keep keys in environment variables, never in config.toml."
            )
        if name in translation.flags:
            source = translation.sources.get(name, "a config key")
            raise LaunchError(
                f"{where}: {raw_name!r} is already set from {source}. "
                "Fix: remove it from [extra_engine_args] and change that key instead."
            )
        if not spec.takes_value:
            if not isinstance(value, bool):
                raise LaunchError(
                    f"{where}: {raw_name!r} is a switch of {engine_label}; "
                    f"write true or false, not {format_value(value)}."
                )
            if value:
                translation.flags[name] = SWITCH
                translation.sources[name] = f"{where} {raw_name}"
            continue
        text = render_value(value)
        if spec.choices and text not in spec.choices:
            raise LaunchError(
                f"{where}: {raw_name} = {format_value(value)} is not one of {', '.join(spec.choices)} ({engine_label})."
            )
        translation.flags[name] = text
        translation.sources[name] = f"{where} {raw_name}"


def flags_to_argv(flags: Flags) -> list[str]:
    """The flags as argv: a switch alone, every other flag followed by its value (an empty one too)."""
    argv: list[str] = []
    for name, value in flags.items():
        argv.append(name)
        if value is not None:  # SWITCH
            argv.append(value)
    return argv


def require_model_path(cfg: HybridConfig) -> None:
    if not cfg.config.server.model_path.strip():
        raise LaunchError(
            "config.toml [server] model_path is empty, so there is nothing to serve. Fix: set "
            'model_path = "/path/to/model" (a directory with config.json and safetensors, or a hub id).'
        )


def multinode_problem(cfg: HybridConfig) -> tuple[str, str, str] | None:
    """(key, message, fix) when the node settings cannot start, else None. Used by launch and by validate."""
    server = cfg.config.server
    if server.nnodes > 1 and not server.dist_init_addr:
        return (
            "server.dist_init_addr",
            f"nnodes = {server.nnodes} but dist_init_addr is unset, so the nodes cannot find each other.",
            toml_set("server.dist_init_addr", '"<node 0 address>:<port>"') + " (the same on every node)",
        )
    if server.node_rank >= server.nnodes:
        return (
            "server.node_rank",
            f"node_rank = {server.node_rank} is not below nnodes = {server.nnodes}.",
            f"use node_rank 0..{server.nnodes - 1} in [server] of {CONFIG}, one per node",
        )
    return None
