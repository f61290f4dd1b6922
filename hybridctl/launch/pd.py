"""Prefill/decode disaggregation: one config -> a prefill server, a decode server and sglang-router in front.

The router (PyPI package sglang-router) listens on [server] port, the public address; it sends each request to
both servers and they hand over KV and Mamba state through the prefill server's bootstrap port.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from hybridctl.config.schema import HybridConfig
from hybridctl.launch.command import EngineCommand
from hybridctl.launch.sglang_command import check_multinode, sglang_argv, sglang_translation
from hybridctl.launch.translate import Flags, LaunchError

ROUTER_MODULE = "sglang_router.launch_router"


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
        python or sys.executable, "-m", ROUTER_MODULE, "--pd-disaggregation",
        "--prefill", f"http://{worker_host}:{pd.prefill_port}", str(pd.bootstrap_port),
        "--decode", f"http://{worker_host}:{pd.decode_port}",
        "--host", host, "--port", str(server.port),
    ]  # fmt: skip

    def worker(role: str, flags: Flags, port: int) -> EngineCommand:
        return EngineCommand(
            engine="sglang", role=role, argv=sglang_argv(flags, python), host=host, port=port,  # type: ignore[arg-type]
            version=version, ignored=base.ignored,
        )  # fmt: skip

    return PDPlan(
        prefill=worker("prefill", prefill_flags, pd.prefill_port),
        decode=worker("decode", decode_flags, pd.decode_port),
        router=EngineCommand(
            engine="sglang", role="router", argv=router_argv, host=host, port=server.port, version=version
        ),
    )
