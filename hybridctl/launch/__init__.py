"""Config -> engine command lines (bundled runtime or SGLang, one server or PD); starting and stopping them.

Public API (what launch, status, stop and demo use):
    make_launch_plan(cfg, engine) -> LaunchPlan          the commands, without starting anything
    start_server(config_path, ...) -> ServerHandle        start, wait until healthy, record the state file
    server_status(config_path) -> ServerStatus
    stop_server(config_path) -> StopResult | None
"""

from __future__ import annotations

from hybridctl.launch.plan import LaunchPlan, make_launch_plan
from hybridctl.launch.process import ServerHandle, StartupFailed, StopResult, start_server
from hybridctl.launch.recorded import ServerStatus, server_status, stop_server
from hybridctl.launch.state import StateFileError
from hybridctl.launch.translate import LaunchError

__all__ = [
    "LaunchError",
    "LaunchPlan",
    "ServerHandle",
    "ServerStatus",
    "StartupFailed",
    "StateFileError",
    "StopResult",
    "make_launch_plan",
    "server_status",
    "start_server",
    "stop_server",
]
