"""`hybridctl demo` end to end, offline: init --demo, launch, verify all, bench, report.json, stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.conftest import free_port


def hybridctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hybridctl", *args], capture_output=True, text=True, timeout=900
    )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers signal 0; its /proc state says it has exited.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_demo_runs_end_to_end_and_again(tmp_path: Path) -> None:
    out = tmp_path / "hybridctl-demo"
    port = free_port()
    proc = hybridctl("demo", "--dir", str(out), "--port", str(port), "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, json.dumps(report, indent=1)[:4000]
    assert report["passed"] is True and report["url"] == f"http://127.0.0.1:{port}"
    assert [s["name"] for s in report["steps"]] == ["init", "launch", "verify", "bench", "stop"]
    assert all(s["status"] == "ok" for s in report["steps"])
    assert report["verify"]["passed"] is True
    statuses = {c["name"]: c["status"] for c in report["verify"]["checks"]}
    assert statuses == {"basic": "passed", "prefix-cache": "passed", "spec": "skipped", "structured": "passed"}
    assert report["bench"]["failed"] == 0 and report["bench"]["completed"] == 16
    assert report["bench"]["server"] is not None  # the demo turns /metrics on

    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk == report
    for name in ("config.toml", "settings.json", "hybridctl-server.log"):
        assert (out / name).is_file()
    pid = int(report["steps"][1]["detail"].split("pid ")[1].split()[0])
    assert not pid_alive(pid), "the demo left its server running"

    # The README's first command, run twice: the second run keeps the demo the first one built (same model, same
    # files, no --force needed) and runs again.
    model_before = (out / "demo-model" / "model.safetensors").stat().st_mtime_ns
    proc = hybridctl("demo", "--dir", str(out), "--port", str(port), "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    again = json.loads(proc.stdout)
    assert again["passed"] is True and "kept the demo" in again["steps"][0]["detail"]
    assert (out / "demo-model" / "model.safetensors").stat().st_mtime_ns == model_before
    assert json.loads((out / "report.json").read_text())["steps"] == again["steps"]  # this run's own report
