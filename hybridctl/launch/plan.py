"""A launch plan: the engine chosen for a config and the command(s) that serve it, before anything starts."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridctl.config.schema import HybridConfig
from hybridctl.launch.builtin_flags import builtin_command
from hybridctl.launch.command import EngineCommand
from hybridctl.launch.engine_select import Requested, choose_engine
from hybridctl.launch.pd import pd_plan
from hybridctl.launch.sglang_command import sglang_command
from hybridctl.launch.translate import Engine, IgnoredKey
from hybridctl.launch.version import target_version


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
        from hybridctl.launch.builtin_pd import builtin_pd_plan

        trio = builtin_pd_plan(cfg, python=python, allow_ignored=allow_ignored)
        return LaunchPlan("builtin", choice.reason, trio.commands, None, trio.prefill.ignored)
    if choice.engine == "builtin":
        command = builtin_command(cfg, python=python, allow_ignored=allow_ignored)
        return LaunchPlan("builtin", choice.reason, [command], None, command.ignored)
    # --sglang-version, the installed sglang, then config.toml [server] sglang_version (issue 20)
    version = target_version(sglang_version or choice.sglang_version, cfg.config.server.sglang_version)
    if cfg.config.pd.enable_pd_disaggregation:
        plan = pd_plan(cfg, version, python=python, allow_ignored=allow_ignored)
        return LaunchPlan("sglang", choice.reason, plan.commands, version, plan.prefill.ignored)
    command = sglang_command(cfg, version, python=python, allow_ignored=allow_ignored)
    return LaunchPlan("sglang", choice.reason, [command], version, command.ignored)
