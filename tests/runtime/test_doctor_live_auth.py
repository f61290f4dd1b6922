"""`doctor --url` of a server that wants an API key: the refusal names doctor's own --api-key-env, and with it
doctor reads the server (the real bundled runtime over loopback, started with --api-key)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.conftest import REPO_ROOT, start_runtime_server

pytestmark = pytest.mark.slow
KEY = "doctor-key-2b7e1c"


def _doctor(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hybridctl", "doctor", "--no-host", "--json", *args],
        capture_output=True, text=True, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, timeout=300, env=env,
    )  # fmt: skip


def test_doctor_reads_a_keyed_server_with_api_key_env(demo_model_dir: Path) -> None:
    env = {**os.environ, "DOCTOR_TEST_KEY": KEY}
    with start_runtime_server(demo_model_dir, "--api-key", KEY, "--memory-budget-gib", "0.5") as server:
        refused = json.loads(_doctor("--url", server.url, env=env).stdout)
        keyed = json.loads(_doctor("--url", server.url, "--api-key-env", "DOCTOR_TEST_KEY", env=env).stdout)
    (server_check,) = [c for c in refused["checks"] if c["name"] == "Server"]
    assert server_check["status"] == "error" and "--api-key-env" in server_check["summary"]
    (server_check,) = [c for c in keyed["checks"] if c["name"] == "Server"]
    assert server_check["status"] == "ok", server_check
    assert KEY not in json.dumps(keyed)
