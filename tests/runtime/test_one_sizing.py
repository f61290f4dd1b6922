"""One sizing for the bundled runtime: `plan`, `doctor` and `launch --dry-run` on a config give the numbers the real
server then reports in /server_info (the runtime calls hybridshared/sizing/runtime_pools.py itself)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import httpx

from tests.runtime.conftest import start_runtime_server

REPO = Path(__file__).resolve().parents[2]


def hybridctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hybridctl", *args], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def test_plan_doctor_and_server_agree_on_the_builtin_pools(demo_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        f'[server]\nengine = "builtin"\nmodel_path = "{demo_model_dir}"\n[memory]\nmemory_budget_gib = 1.0\n'
    )
    (tmp_path / "settings.json").write_text('{"runtime": {"chunked_prefill_size": 2048}}')
    plan = json.loads(hybridctl("plan", "--json", cwd=tmp_path).stdout)
    assert plan["engine"] == "builtin" and plan["fits"] is True
    doctor = json.loads(hybridctl("doctor", "--json", "--no-host", cwd=tmp_path).stdout)
    pools = next(c for c in doctor["checks"] if c["name"] == "Pools")["summary"]
    assert f"{plan['max_total_num_tokens']} KV tokens" in pools and f"{plan['max_running_requests']} requests" in pools
    dry = hybridctl("launch", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    argv = shlex.split(dry.stdout.strip().splitlines()[-1])
    assert argv[argv.index("--model-path") + 1] == str(demo_model_dir)
    flags = argv[argv.index("--mem-fraction-static") :]  # what launch would pass after the model and address
    with start_runtime_server(demo_model_dir, *flags) as server:
        info = httpx.get(f"{server.url}/server_info", timeout=30).json()
    assert info["max_total_num_tokens"] == plan["max_total_num_tokens"]
    assert info["max_running_requests"] == plan["max_running_requests"]
