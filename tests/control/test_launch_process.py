"""start_server / server_status / stop_server with real processes.

The engine here is a small HTTP process that writes SGLang-format start-up lines and answers /health: the
process control (sessions, state file, readiness, SIGTERM then SIGKILL) is what is under test, not an engine.
The real bundled runtime goes through the same path in tests/runtime/test_launch_live.py.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from hybridctl.launch import LaunchError, StartupFailed, server_status, start_server, stop_server
from hybridctl.launch.command import EngineCommand
from hybridctl.launch.plan import LaunchPlan
from hybridctl.launch.state import process_alive, read_state, state_path_for

ENGINE = r"""
import signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

port, mode = int(sys.argv[1]), sys.argv[2]
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("loading weights", flush=True)
if mode == "crash":
    print("RuntimeError: Not enough memory for the state pool", flush=True)
    sys.exit(3)
print("Mamba Cache is allocated. max_mamba_cache_size: 5, conv_state size: 0.01GB, ssm_state size: 0.02GB ",
      flush=True)
print("KV Cache is allocated. dtype: torch.float32, #tokens: 100, KV size: 0.01 GB", flush=True)


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", port), Health)
if mode == "late-ready":  # healthy at once, warm-up done (ready line) 2 s later, like SGLang can be
    import threading, time
    threading.Thread(target=server.serve_forever, daemon=True).start()
    time.sleep(2.0)
    print("The server is fired up and ready to roll!", flush=True)
    threading.Event().wait()
print("The server is fired up and ready to roll!", flush=True)
server.serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _plan(tmp_path: Path, mode: str) -> LaunchPlan:
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    port = _free_port()
    argv = [sys.executable, str(script), str(port), mode]
    command = EngineCommand(engine="builtin", role="server", argv=argv, host="127.0.0.1", port=port)
    return LaunchPlan("builtin", "test", [command])


def test_start_status_stop(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    handle = start_server(config, plan=_plan(tmp_path, "serve"), startup_timeout_s=60)
    try:
        info = handle.startup["server"]
        assert info.mamba is not None and info.mamba.max_mamba_cache_size == 5
        assert info.kv[0].tokens == 100 and info.ready
        assert handle.log_path == tmp_path / "hybridctl-server.log"
        state = read_state(state_path_for(config))
        assert state is not None and state.processes[0].pid == handle.pid and state.url == handle.url
        status = server_status(config)
        assert status.running and status.healthy and status.alive == {handle.pid: True}
        with pytest.raises(LaunchError, match="already runs"):
            start_server(config, plan=_plan(tmp_path, "serve"))
    finally:
        result = stop_server(config, timeout_s=10)
    assert result is not None and result.stopped == [handle.pid] and result.killed == []
    handle.alive()  # reap
    assert not process_alive(handle.pid, None)
    assert not state_path_for(config).exists()
    assert not server_status(config).running
    assert stop_server(config) is None


def test_stop_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    handle = start_server(config, plan=_plan(tmp_path, "ignore-term"), startup_timeout_s=60)
    result = handle.stop(timeout_s=1.0)
    assert result.killed == [handle.pid] and result.stopped == []
    assert not handle.alive()
    assert not state_path_for(config).exists()


def test_start_up_failure_shows_the_log_and_the_doctor_hint(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    (tmp_path / "hybridctl-server.log").write_text("previous run\n")
    with pytest.raises(StartupFailed) as err:
        start_server(config, plan=_plan(tmp_path, "crash"), startup_timeout_s=60)
    message = str(err.value)
    assert "exited with code 3" in message
    assert "Not enough memory for the state pool" in message
    assert f"hybridctl doctor --log {tmp_path / 'hybridctl-server.log'}" in message
    assert not state_path_for(config).exists()
    assert (tmp_path / "hybridctl-server.log.1").read_text() == "previous run\n"


def test_without_detach_the_server_stops_when_the_caller_exits(tmp_path: Path) -> None:
    import subprocess

    plan = _plan(tmp_path, "serve")
    code = (
        "import sys\n"
        "from hybridctl.launch import start_server\n"
        "from hybridctl.launch.command import EngineCommand\n"
        "from hybridctl.launch.plan import LaunchPlan\n"
        f"command = EngineCommand('builtin', 'server', {plan.commands[0].argv!r}, '127.0.0.1', "
        f"{plan.commands[0].port})\n"
        "plan = LaunchPlan('builtin', 'test', [command])\n"
        f"handle = start_server({str(tmp_path / 'config.toml')!r}, plan=plan, detach=False)\n"
        "print(handle.pid)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[-1])
    assert not process_alive(pid, None)
    assert not state_path_for(tmp_path / "config.toml").exists()


def test_a_busy_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "serve")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", plan.commands[0].port))
        taken.listen()
        with pytest.raises(LaunchError, match=f"port {plan.commands[0].port} .* already in use"):
            start_server(tmp_path / "config.toml", plan=plan)
    assert not (tmp_path / "hybridctl-server.log").exists()
    assert not state_path_for(tmp_path / "config.toml").exists()


def test_a_missing_engine_package_is_refused_before_anything_starts(tmp_path: Path) -> None:
    port = _free_port()
    argv = [sys.executable, "-m", "hybridctl_no_such_engine.launch_server", "--port", str(port)]
    command = EngineCommand(engine="sglang", role="server", argv=argv, host="127.0.0.1", port=port)
    with pytest.raises(LaunchError, match="hybridctl_no_such_engine is not installed .*--engine builtin"):
        start_server(tmp_path / "config.toml", plan=LaunchPlan("sglang", "test", [command]))
    assert not (tmp_path / "hybridctl-server.log").exists()


def test_readiness_waits_for_the_ready_line_after_health(tmp_path: Path) -> None:
    import time

    started = time.monotonic()
    with start_server(
        tmp_path / "config.toml", plan=_plan(tmp_path, "late-ready"), startup_timeout_s=60
    ) as handle:
        assert handle.startup["server"].ready
        assert time.monotonic() - started >= 2.0
    assert not handle.alive()
