"""Prefill/decode disaggregation: one config -> a prefill server, a decode server and sglang-router in front.

The router (PyPI package sglang-router) listens on [server] port, the public address; it sends each request to
both servers and they hand over KV and Mamba state through the prefill server's bootstrap port.

On the bundled runtime (`builtin_pd_plan`) the same config gives a prefill runtime, a decode runtime and
hybridctl's PD router (pd_router.py) on [server] port, so clients and `verify` see one server either way; the
decode runtime fetches each prompt's KV and state from the prefill runtime's [pd] bootstrap_port.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from hybridctl.config.schema import HybridConfig
from hybridctl.launch.builtin_flags import RUNTIME_FLAGS
from hybridctl.launch.command import EngineCommand, Role, add_extra_args, flags_to_argv, require_model_path
from hybridctl.launch.sglang import check_multinode, sglang_argv, sglang_translation
from hybridctl.launch.translate import Flags, LaunchError, refuse_ignored, translate

SGLANG_ROUTER_MODULE = "sglang_router.launch_router"


@dataclass
class PDPlan:
    prefill: EngineCommand
    decode: EngineCommand
    router: EngineCommand

    @property
    def commands(self) -> list[EngineCommand]:
        # Start order: the workers first, the router last (it checks its workers when it starts).
        return [self.prefill, self.decode, self.router]


def _role_flags(base: Flags, updates: Flags) -> Flags:
    flags = {k: v for k, v in base.items() if k != "--port"}
    flags.update(updates)
    return flags


def pd_plan(
    cfg: HybridConfig, version: str, python: str | None = None, allow_ignored: bool = False
) -> PDPlan:
    """The three commands of a PD deployment of `cfg` (which must enable [pd])."""
    pd, server = cfg.config.pd, cfg.config.server
    if not pd.enable_pd_disaggregation:
        raise LaunchError("config.toml [pd] enable_pd_disaggregation is false; there is no PD plan to make.")
    ports = {"[server] port": server.port, "[pd] prefill_port": pd.prefill_port,
             "[pd] decode_port": pd.decode_port, "[pd] bootstrap_port": pd.bootstrap_port}  # fmt: skip
    if len(set(ports.values())) != len(ports):
        listed = ", ".join(f"{k} = {v}" for k, v in ports.items())
        raise LaunchError(
            f"config.toml: PD needs four different ports, got {listed}. Fix: make them distinct."
        )
    check_multinode(cfg)
    base = sglang_translation(cfg, version, allow_ignored)
    for placed in ("--disaggregation-mode", "--disaggregation-bootstrap-port", "--port"):
        if placed in base.flags and base.sources.get(placed, "").startswith(
            "config.toml [extra_engine_args]"
        ):
            raise LaunchError(
                f"config.toml [extra_engine_args] sets {placed}, which PD sets per server. Fix: remove it; "
                "the ports are [pd] prefill_port, decode_port and bootstrap_port."
            )
    prefill_flags = _role_flags(base.flags, {
        "--port": str(pd.prefill_port),
        "--disaggregation-mode": "prefill",
        "--disaggregation-bootstrap-port": str(pd.bootstrap_port),
    })  # fmt: skip
    decode_updates: Flags = {"--port": str(pd.decode_port), "--disaggregation-mode": "decode"}
    if server.nnodes == 1 and "--base-gpu-id" not in base.flags:
        # On one node the decode server takes the GPUs after the prefill server's (tp * dp of them).
        decode_updates["--base-gpu-id"] = str(server.tp_size * server.dp_size)
    decode_flags = _role_flags(base.flags, decode_updates)
    host = server.host
    worker_host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    router_argv = [
        python or sys.executable, "-m", SGLANG_ROUTER_MODULE, "--pd-disaggregation",
        "--prefill", f"http://{worker_host}:{pd.prefill_port}", str(pd.bootstrap_port),
        "--decode", f"http://{worker_host}:{pd.decode_port}",
        "--host", host, "--port", str(server.port),
    ]  # fmt: skip

    def worker(role: Role, flags: Flags, port: int) -> EngineCommand:
        return EngineCommand(
            engine="sglang", role=role, argv=sglang_argv(flags, python), host=host, port=port,
            version=version, ignored=base.ignored,
        )  # fmt: skip

    return PDPlan(
        prefill=worker("prefill", prefill_flags, pd.prefill_port),
        decode=worker("decode", decode_flags, pd.decode_port),
        router=EngineCommand(
            engine="sglang", role="router", argv=router_argv, host=host, port=server.port, version=version
        ),
    )


BUILTIN_ROUTER_MODULE = "hybridctl.launch.pd_router"


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

    def worker(role: Role, port: int, extra: Flags) -> EngineCommand:
        flags = {k: v for k, v in translation.flags.items() if k != "--port"}
        flags.update({"--port": str(port), **extra})
        argv = [exe, "-m", "runtime", *flags_to_argv(flags)]
        return EngineCommand(engine="builtin", role=role, argv=argv, host=server.host, port=port,
                             ignored=translation.ignored)  # fmt: skip

    prefill = worker("prefill", pd.prefill_port, {
        "--disaggregation-mode": "prefill", "--disaggregation-bootstrap-port": str(pd.bootstrap_port),
    })  # fmt: skip
    decode = worker("decode", pd.decode_port, {"--disaggregation-mode": "decode"})
    router_argv = [
        exe, "-m", BUILTIN_ROUTER_MODULE,
        "--prefill", prefill.url, str(pd.bootstrap_port),
        "--decode", decode.url,
        "--host", server.host, "--port", str(server.port),
    ]  # fmt: skip
    router = EngineCommand("builtin", "router", router_argv, host=server.host, port=server.port)
    return PDPlan(prefill=prefill, decode=decode, router=router)
