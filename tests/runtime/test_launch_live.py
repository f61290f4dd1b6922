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
