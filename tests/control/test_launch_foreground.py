"""A foreground launch stops what it started when it is told to stop: SIGTERM, SIGINT and SIGHUP are forwarded.

hybridctl runs in a subprocess exactly as `hybridctl launch` does it (start_server inside forwarded_signals, then
follow); the engine is a small HTTP process in its own session that logs which signal reached it. The real CLI
with the bundled runtime goes through the same path in tests/runtime/test_launch_live.py.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridctl.launch.state import process_alive, read_state, state_path_for

ENGINE = r"""
import signal, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

port, delay = int(sys.argv[1]), float(sys.argv[2])

def report(signum, frame):
    print("engine got", signal.Signals(signum).name, flush=True)
    sys.exit(0)

for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, report)
print("loading", flush=True)
time.sleep(delay)  # a slow start-up: the signal can arrive before the server answers


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", port), Health)
print("The server is fired up and ready to roll!", flush=True)
server.serve_forever()
"""

# What `hybridctl launch` (without --detach) does after the plan, minus the rendering.
LAUNCHER = r"""
import sys
from hybridctl.launch.command import EngineCommand
from hybridctl.launch.foreground import follow, forwarded_signals
from hybridctl.launch.plan import LaunchPlan
from hybridctl.launch.process import StopSignal, start_server

config, argv, port = sys.argv[1], sys.argv[2:-1], int(sys.argv[-1])
plan = LaunchPlan("builtin", "test", [EngineCommand("builtin", "server", argv, "127.0.0.1", port)])
handle = None
with forwarded_signals():
    try:
        handle = start_server(config, plan=plan, startup_timeout_s=60)
        print("ready", handle.pid, flush=True)
        code = follow(handle, lambda chunk: None, poll_s=0.1)
    except StopSignal as exc:  # arrived between start_server and follow: launch_cmd stops the server here too
        if handle is not None:
            handle.stop(sig=exc.signal)
        code = exc.exit_code
sys.exit(code)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    # SO_REUSEADDR as servers set it: the health checks' closed connections may sit in TIME_WAIT, a listener not.
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _launch(tmp_path: Path, delay: float) -> tuple[subprocess.Popen[str], Path, int]:
    (tmp_path / "engine.py").write_text(ENGINE)
    port = _free_port()
    config = tmp_path / "config.toml"
    argv = [sys.executable, str(tmp_path / "engine.py"), str(port), str(delay)]
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(config), *argv, str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    return proc, config, port


def _wait_for_state(config: Path, proc: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        state = read_state(state_path_for(config)) if state_path_for(config).exists() else None
        if state is not None and state.processes:
            return state.processes[0].pid
        time.sleep(0.05)
    raise AssertionError(f"no server recorded; launcher: {proc.poll()} {proc.stderr.read() if proc.stderr else ''}")


@pytest.mark.parametrize(
    "sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)], ids=lambda v: str(v)
)
def test_a_signal_to_the_foreground_launch_stops_the_server(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    proc, config, port = _launch(tmp_path, delay=0.0)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready"), line + proc.stderr.read()  # type: ignore[union-attr]
    server_pid = int(line.split()[1])
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == code, proc.stderr.read()  # type: ignore[union-attr]
    assert not process_alive(server_pid, None)
    assert _port_free(port)
    assert not state_path_for(config).exists()
    assert f"engine got {sig.name}" in (tmp_path / "hybridctl-server.log").read_text()


def test_sigterm_during_start_up_stops_what_was_started(tmp_path: Path) -> None:
    proc, config, port = _launch(tmp_path, delay=30.0)
    server_pid = _wait_for_state(config, proc)
    log, deadline = tmp_path / "hybridctl-server.log", time.monotonic() + 60
    while "loading" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)  # its handlers are in place: what it reports is the signal that reached it
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143, proc.stderr.read()  # type: ignore[union-attr]
    assert not process_alive(server_pid, None)
    assert _port_free(port)
    assert not state_path_for(config).exists()
    assert "engine got SIGTERM" in (tmp_path / "hybridctl-server.log").read_text()
