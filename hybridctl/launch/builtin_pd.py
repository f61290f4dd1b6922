"""PD on the bundled runtime: one config -> a prefill runtime, a decode runtime and hybridctl's PD router.

The router (hybridctl/launch/pd_router.py) listens on [server] port, so clients and `verify` see one server
whether PD is on or off; the runtimes listen on [pd] prefill_port and decode_port, and the decode runtime
fetches each prompt's KV and state from the prefill runtime's [pd] bootstrap_port.
"""

from __future__ import annotations

import sys

from hybridctl.config.schema import HybridConfig
from hybridctl.launch.builtin_flags import RUNTIME_FLAGS
from hybridctl.launch.command import EngineCommand, add_extra_args, flags_to_argv, require_model_path
from hybridctl.launch.pd import PDPlan
from hybridctl.launch.translate import Flags, LaunchError, refuse_ignored, translate

ROUTER_MODULE = "hybridctl.launch.pd_router"


def builtin_pd_plan(cfg: HybridConfig, python: str | None = None, allow_ignored: bool = False) -> PDPlan:
    """The three commands of a bundled-runtime PD deployment of `cfg` (which must enable [pd])."""
    pd, server = cfg.config.pd, cfg.config.server
    ports = {"[server] port": server.port, "[pd] prefill_port": pd.prefill_port,
             "[pd] decode_port": pd.decode_port, "[pd] bootstrap_port": pd.bootstrap_port}  # fmt: skip
    if len(set(ports.values())) != len(ports):
        listed = ", ".join(f"{k} = {v}" for k, v in ports.items())
        raise LaunchError(f"config.toml: PD needs four different ports, got {listed}. Fix: make them differ.")
    require_model_path(cfg)
    translation = translate(cfg, "builtin")
    refuse_ignored(translation, allow_ignored)
    add_extra_args(translation, cfg.config.extra_engine_args, RUNTIME_FLAGS, "the bundled runtime")
    for placed in ("--disaggregation-mode", "--disaggregation-bootstrap-port", "--port"):
        if translation.sources.get(placed, "").startswith("config.toml [extra_engine_args]"):
            raise LaunchError(
                f"config.toml [extra_engine_args] sets {placed}, which PD sets per server. Fix: remove it; "
                "the ports are [pd] prefill_port, decode_port and bootstrap_port."
            )
    exe = python or sys.executable

    def worker(role: str, port: int, extra: Flags) -> EngineCommand:
        flags = {k: v for k, v in translation.flags.items() if k != "--port"}
        flags.update({"--port": str(port), **extra})
        argv = [exe, "-m", "runtime", *flags_to_argv(flags)]
        return EngineCommand(engine="builtin", role=role, argv=argv, host=server.host, port=port,  # type: ignore[arg-type]
                             ignored=translation.ignored)  # fmt: skip

    prefill = worker("prefill", pd.prefill_port, {
        "--disaggregation-mode": "prefill", "--disaggregation-bootstrap-port": str(pd.bootstrap_port),
    })  # fmt: skip
    decode = worker("decode", pd.decode_port, {"--disaggregation-mode": "decode"})
    router_argv = [
        exe, "-m", ROUTER_MODULE,
        "--prefill", prefill.url, str(pd.bootstrap_port),
        "--decode", decode.url,
        "--host", server.host, "--port", str(server.port),
    ]  # fmt: skip
    router = EngineCommand("builtin", "router", router_argv, host=server.host, port=server.port)
    return PDPlan(prefill=prefill, decode=decode, router=router)
