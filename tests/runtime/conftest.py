"""Shared fixtures for live runtime tests: the demo model, built once, and a real `python -m runtime` server.

`start_runtime_server(model_dir, *extra_args)` starts the server as a subprocess on a free loopback port,
waits until `/health` answers 200, yields a `RunningServer` (`.url`, `.port`, `.log_path`, `.process`), then
stops it with SIGTERM and checks it really exited. Nothing here imitates the runtime: tests talk to it over
HTTP. Import it as `from tests.runtime.conftest import start_runtime_server`, or use the
`runtime_server_factory` fixture.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RunningServer:
    url: str
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def free_port() -> int:
    """A port that was free a moment ago (the kernel picks it; the server binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


@contextmanager
def start_runtime_server(
    model_dir: str | os.PathLike[str],
    *extra_args: str,
    startup_timeout_s: float = 180.0,
    env: dict[str, str] | None = None,
    log_dir: str | os.PathLike[str] | None = None,
) -> Iterator[RunningServer]:
    """Run a real runtime server for the duration of the `with` block."""
    directory = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="runtime-server-"))
    directory.mkdir(parents=True, exist_ok=True)
    child_env = dict(os.environ)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    if env:
        child_env.update(env)
    # The port is free when picked but bound only after the model loaded (seconds): another socket of a busy host
    # may take it meanwhile. Only that case, the server's own bind of the port it was given, starts it again.
    for attempt in range(1, _PORT_TRIES + 1):
        server = _launch(model_dir, extra_args, free_port(), directory, child_env)
        try:
            _wait_healthy(server, startup_timeout_s)
        except _PortTaken:
            if attempt == _PORT_TRIES:
                raise
            continue
        except BaseException:
            _stop(server.process)
            raise
        break
    proc, log_path = server.process, server.log_path
    try:
        yield server
    finally:
        _stop(proc)
    # Checked after the block so a test failure inside it is not masked by this one. SIGTERM is a graceful
    # shutdown (open requests aborted, engine stopped): anything but exit code 0 is a bug.
    assert proc.returncode == 0, (
        f"runtime server exited with {proc.returncode} after SIGTERM; log {log_path}:\n{_log_tail(log_path)}"
    )


_PORT_TRIES = 3


class _PortTaken(RuntimeError):
    """The server exited because the port picked for it was taken before it could bind it."""


def _launch(
    model_dir: str | os.PathLike[str], extra_args: tuple[str, ...], port: int, directory: Path, env: dict[str, str]
) -> RunningServer:
    log_path = directory / f"server-{port}.log"
    cmd = [
        sys.executable, "-m", "runtime",
        "--model-path", str(model_dir),
        "--host", "127.0.0.1",
        "--port", str(port),
        *extra_args,
    ]  # fmt: skip
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env)
    return RunningServer(url=f"http://127.0.0.1:{port}", port=port, log_path=log_path, process=proc)


def _wait_healthy(server: RunningServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                log = _log_tail(server.log_path)
                bind_error = f"error while attempting to bind on address ('127.0.0.1', {server.port})"
                kind = _PortTaken if bind_error in log and "address already in use" in log else RuntimeError
                raise kind(
                    f"runtime server exited with code {server.process.returncode} before it was healthy; "
                    f"log {server.log_path}:\n{log}"
                )
            try:
                if client.get(server.url + "/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
    _stop(server.process)
    raise RuntimeError(
        f"runtime server not healthy after {timeout_s:.0f}s; log {server.log_path}:\n{_log_tail(server.log_path)}"
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo Qwen3-Next (weights + tokenizer), built once per test session."""
    from runtime.demo_model import build_demo_model

    out = tmp_path_factory.mktemp("demo-model") / "model"
    return Path(build_demo_model(out))


@pytest.fixture(scope="session")
def runtime_server(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One runtime server with default flags plus metrics and a 1 GiB memory budget, shared by a session."""
    log_dir = tmp_path_factory.mktemp("runtime-server-logs")
    # 1 GiB instead of the 4 GiB default: several test servers may share a small CI machine.
    flags = ("--enable-metrics", "--memory-budget-gib", "1")
    with start_runtime_server(demo_model_dir, *flags, log_dir=log_dir) as server:
        yield server


@pytest.fixture(scope="session")
def runtime_server_factory() -> object:
    """`start_runtime_server` as a fixture, for tests that prefer not to import from conftest."""
    return start_runtime_server
