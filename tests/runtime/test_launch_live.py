"""`hybridctl launch --detach` a real bundled runtime on the demo model, then `status`, a request, `stop`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from hybridctl.launch.state import process_alive
from tests.runtime.conftest import free_port


def _hybridctl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hybridctl", *args], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.mark.slow
def test_launch_detach_status_stop_on_the_demo_model(demo_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nmodel_path = "{demo_model_dir}"\nport = {port}\nengine = "builtin"\n'
        "[memory]\nmemory_budget_gib = 1.0\n"
    )
    (tmp_path / "settings.json").write_text(json.dumps({"runtime": {"max_running_requests": 4}}))
    launched = _hybridctl("launch", str(config), "--detach", "--timeout", "240")
    try:
        assert launched.returncode == 0, launched.stdout + launched.stderr
        out = launched.stdout
        assert f"ready at http://127.0.0.1:{port}" in out
        assert "state slots (max_mamba_cache_size)" in out and "KV pool tokens" in out
        log = tmp_path / "hybridctl-server.log"
        assert "The server is fired up and ready to roll!" in log.read_text()

        status = _hybridctl("status", str(config), "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        info = json.loads(status.stdout)
        assert info["running"] and info["healthy"] and info["engine"] == "builtin"
        pid = info["processes"][0]["pid"]
        argv = info["processes"][0]["argv"]
        assert argv[1:3] == ["-m", "runtime"] and argv[argv.index("--max-running-requests") + 1] == "4"

        request = {"text": "hello", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
        reply = httpx.post(f"http://127.0.0.1:{port}/generate", json=request, timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["meta_info"]["completion_tokens"] == 4
    finally:
        stopped = _hybridctl("stop", str(config), "--json")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    result = json.loads(stopped.stdout)
    assert result["stopped"] == [pid] and result["killed"] == []
    assert not process_alive(pid, None)
    assert not (tmp_path / ".hybridctl" / "server.json").exists()
    assert _hybridctl("status", str(config)).returncode == 3


@pytest.mark.slow
def test_sigterm_to_a_foreground_launch_stops_the_server(demo_model_dir: Path, tmp_path: Path) -> None:
    # How systemd, `docker stop` and Kubernetes end a foreground process: SIGTERM to hybridctl alone.
    import signal
    import socket
    import time

    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nmodel_path = "{demo_model_dir}"\nport = {port}\nengine = "builtin"\n'
        "[memory]\nmemory_budget_gib = 1.0\n"
    )
    launch = subprocess.Popen([sys.executable, "-m", "hybridctl", "launch", str(config), "--timeout", "240"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    state = tmp_path / ".hybridctl" / "server.json"
    pid = 0
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and launch.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200 and state.exists():
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert launch.poll() is None, launch.communicate()
        pid = json.loads(state.read_text())["processes"][0]["pid"]
        launch.send_signal(signal.SIGTERM)
        out, err = launch.communicate(timeout=60)
    finally:
        if launch.poll() is None:
            launch.kill()
        if pid and process_alive(pid, None):  # what a launch that ignores SIGTERM would leave behind
            import os

            os.killpg(pid, signal.SIGKILL)
    assert launch.returncode == 143, out + err
    assert "Traceback" not in err
    assert not process_alive(pid, None)
    assert not state.exists()
    with socket.socket() as sock:  # nothing listens there any more
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
    assert _hybridctl("status", str(config)).returncode == 3
