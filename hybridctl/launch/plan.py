"""A launch plan: the engine chosen for a config and the command(s) that serve it, before anything starts.

The engine: SGLang on a host with an NVIDIA GPU and sglang installed, else the bundled runtime (`decide_engine`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import get_args

from hybridctl.config.schema import EngineName, HybridConfig
from hybridctl.host.facts import HostFacts
from hybridctl.host.probe import probe_host
from hybridctl.launch.builtin_flags import builtin_command
from hybridctl.launch.command import EngineCommand
from hybridctl.launch.pd import builtin_pd_plan, pd_plan
from hybridctl.launch.sglang import sglang_command
from hybridctl.launch.translate import Engine, IgnoredKey, LaunchError, target_version


@dataclass
class LaunchPlan:
    engine: Engine
    engine_reason: str
    commands: list[EngineCommand]  # in start order; the last one is the public endpoint
    version: str | None = None  # SGLang version the flags are written for
    ignored: list[IgnoredKey] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.commands[-1].url

    def to_dict(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "engine_reason": self.engine_reason,
            "version": self.version,
            "url": self.url,
            "commands": [c.to_dict() for c in self.commands],
            "ignored": [i.describe() for i in self.ignored],
            "ignored_keys": [
                {"file": i.file, "key": i.key, "value": i.value, "reason": i.reason} for i in self.ignored
            ],
        }


def make_launch_plan(
    cfg: HybridConfig,
    engine: Requested | None = None,
    *,
    sglang_version: str | None = None,
    allow_ignored: bool = False,
    python: str | None = None,
) -> LaunchPlan:
    """Choose the engine (`engine`, else [server] engine; auto looks at the host) and build its commands.

    Raises LaunchError for keys the engine would ignore (unless `allow_ignored`) and for bad
    extra_engine_args.
    """
    if engine:
        choice = choose_engine(engine, "--engine")
    else:
        choice = choose_engine(cfg.config.server.engine, "config.toml [server] engine =")
    if choice.engine == "builtin" and cfg.config.pd.enable_pd_disaggregation:
        trio = builtin_pd_plan(cfg, python=python, allow_ignored=allow_ignored)
        return LaunchPlan("builtin", choice.reason, trio.commands, None, trio.prefill.ignored)
    if choice.engine == "builtin":
        command = builtin_command(cfg, python=python, allow_ignored=allow_ignored)
        return LaunchPlan("builtin", choice.reason, [command], None, command.ignored)
    # --sglang-version, the installed sglang, then config.toml [server] sglang_version
    version = target_version(sglang_version or choice.sglang_version, cfg.config.server.sglang_version)
    if cfg.config.pd.enable_pd_disaggregation:
        plan = pd_plan(cfg, version, python=python, allow_ignored=allow_ignored)
        return LaunchPlan("sglang", choice.reason, plan.commands, version, plan.prefill.ignored)
    command = sglang_command(cfg, version, python=python, allow_ignored=allow_ignored)
    return LaunchPlan("sglang", choice.reason, [command], version, command.ignored)


Requested = EngineName
ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)


@dataclass(frozen=True)
class EngineChoice:
    engine: Engine
    reason: str
    sglang_version: str | None  # installed sglang, None when absent


def choose_engine(requested: Requested, source: str = "--engine") -> EngineChoice:
    """Resolve `auto` from this host (NVML GPUs, sglang package metadata — sglang is never imported)."""

    return decide_engine(requested, probe_host(), source)


def auto_engine_here() -> Engine:
    """What `engine = "auto"` resolves to on this host (validate and doctor check against the same engine)."""
    return choose_engine("auto").engine


def decide_engine(requested: str, facts: HostFacts, source: str = "--engine") -> EngineChoice:
    """The one engine rule, pure over probed facts: auto = sglang with a GPU and sglang installed, else builtin."""
    sglang_version = facts.sglang.version if facts.sglang else None
    if requested == "builtin":
        return EngineChoice("builtin", f"{source} builtin", sglang_version)
    if requested == "sglang":
        return EngineChoice("sglang", f"{source} sglang", sglang_version)
    if requested != "auto":
        raise LaunchError(f"unknown engine {requested!r}; use {', '.join(ENGINE_NAMES)}")
    if facts.gpus and sglang_version:
        return EngineChoice("sglang", f"{len(facts.gpus)} GPU(s) and sglang {sglang_version} found", sglang_version)
    checks = (("no NVIDIA GPU", bool(facts.gpus)), ("sglang not installed", bool(sglang_version)))
    missing = [what for what, ok in checks if not ok]
    return EngineChoice("builtin", f"{' and '.join(missing)}: using the bundled runtime", sglang_version)
