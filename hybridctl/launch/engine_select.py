"""Which engine serves: SGLang on a host with an NVIDIA GPU and sglang installed, else the bundled runtime."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from hybridctl.config.schema import EngineName
from hybridctl.host.facts import HostFacts
from hybridctl.launch.translate import Engine, LaunchError

Requested = EngineName
ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)


@dataclass(frozen=True)
class EngineChoice:
    engine: Engine
    reason: str
    sglang_version: str | None  # installed sglang, None when absent


def choose_engine(requested: Requested, source: str = "--engine") -> EngineChoice:
    """Resolve `auto` from this host (NVML GPUs, sglang package metadata — sglang is never imported)."""
    from hybridctl.host.probe import probe_host

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
        return EngineChoice(
            "sglang", f"{len(facts.gpus)} GPU(s) and sglang {sglang_version} found", sglang_version
        )
    checks = (("no NVIDIA GPU", bool(facts.gpus)), ("sglang not installed", bool(sglang_version)))
    missing = [what for what, ok in checks if not ok]
    return EngineChoice("builtin", f"{' and '.join(missing)}: using the bundled runtime", sglang_version)
