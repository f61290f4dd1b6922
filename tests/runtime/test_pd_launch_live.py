"""`hybridctl launch` of a [pd] config on the bundled runtime: prefill + decode runtimes and the PD router, one
public port; a request through it, `verify basic` on it, `status` of the trio, `stop` of all three."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from hybridctl.launch.state import process_alive
from tests.runtime.conftest import free_port


def _hybridctl(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hybridctl", *args], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.mark.slow
def test_launch_starts_the_pd_trio_behind_one_port(demo_model_dir: Path, tmp_path: Path) -> None:
    port, prefill, decode, bootstrap = (free_port() for _ in range(4))
    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nmodel_path = "{demo_model_dir}"\nport = {port}\nengine = "builtin"\n'
        "[memory]\nmemory_budget_gib = 0.5\n"
        f"[pd]\nenable_pd_disaggregation = true\nprefill_port = {prefill}\ndecode_port = {decode}\n"
        f"bootstrap_port = {bootstrap}\n"
    )
    (tmp_path / "settings.json").write_text("{}")
    launched = _hybridctl("launch", str(config), "--detach", "--timeout", "300")
    pids: list[int] = []
    try:
        assert launched.returncode == 0, launched.stdout + launched.stderr
        status = json.loads(_hybridctl("status", str(config), "--json").stdout)
        assert [p["role"] for p in status["processes"]] == ["prefill", "decode", "router"]
        pids = [p["pid"] for p in status["processes"]]
        url = f"http://127.0.0.1:{port}"
        body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
        routed = httpx.post(url + "/generate", json=body, timeout=120)
        assert routed.status_code == 200, routed.text
        direct = httpx.post(f"http://127.0.0.1:{decode}/generate", json=body, timeout=120)
        assert routed.json()["output_ids"] == direct.json()["output_ids"]
        info = httpx.get(url + "/server_info", timeout=30).json()
        assert info["disaggregation_mode"] == "decode"
        assert httpx.get(url + "/model_info", timeout=30).json()["disaggregation_mode"] == "decode"
        verified = _hybridctl("verify", "basic", "--config", str(config))  # clients see one server
        assert verified.returncode == 0, verified.stdout + verified.stderr
    finally:
        stopped = _hybridctl("stop", str(config), "--json")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert sorted(json.loads(stopped.stdout)["stopped"]) == sorted(pids)
    assert not any(process_alive(pid, None) for pid in pids)
