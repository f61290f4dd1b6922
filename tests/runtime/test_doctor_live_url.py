"""`doctor --url` against the real bundled runtime over loopback: a healthy server gives no failure code, a server
whose cached prefixes lose their recurrent state gives PREFIX_CACHE_MISS from the repeated-prompt probe, a server
run without the radix cache gets only an informational note, and the CLI reports it all in the findings format."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybridctl.doctor.findings import CODES
from hybridctl.doctor.live import live_findings, read_live
from hybridctl.doctor.run import DoctorOptions, run_doctor, unprobed_host
from tests.runtime.conftest import REPO_ROOT, start_runtime_server
from tests.runtime.test_doctor_live import runtime_flags, write_project

pytestmark = pytest.mark.slow


def test_healthy_server_has_no_failure_and_serves_the_probe_from_cache(demo_model_dir: Path, tmp_path: Path) -> None:
    config = write_project(tmp_path, demo_model_dir)
    flags = (*runtime_flags(config), "--enable-metrics")
    with start_runtime_server(demo_model_dir, *flags, log_dir=tmp_path) as server:
        snap = read_live(server.url)
        assert snap.metrics is not None and snap.metrics.has("sglang:mamba_usage")
        assert snap.probe_cached[0] == 0 and max(snap.probe_cached[1:]) > 0, snap.probe_cached
        assert [f for f in live_findings(snap) if f.code in CODES] == []
        report = run_doctor(DoctorOptions(config_path=tmp_path / "absent.toml", url=server.url), unprobed_host())
        (check,) = [c for c in report.checks if c.name == "Server"]
        assert check.status == "ok" and server.url in check.summary


def test_state_lost_on_prefix_hits_is_a_live_prefix_cache_miss(demo_model_dir: Path, tmp_path: Path) -> None:
    config = write_project(tmp_path, demo_model_dir, settings={"mamba": {"state_snapshot_on_match": False}})
    with start_runtime_server(demo_model_dir, *runtime_flags(config), log_dir=tmp_path) as server:
        res = subprocess.run(
            [sys.executable, "-m", "hybridctl", "doctor", "--no-host", "--url", server.url, "--json",
            ],
            capture_output=True, text=True, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, timeout=300,
        )  # fmt: skip
    out = json.loads(res.stdout)
    live = [f for f in out["findings"] if f["source"] == "live"]
    assert [(f["code"], f["severity"]) for f in live] == [("PREFIX_CACHE_MISS", "error")], res.stdout
    assert "cached_tokens per repeat: [0, 0, 0]" in live[0]["evidence"]
    assert res.returncode == 2 and out["exit_code"] == 2


def test_radix_cache_off_is_only_a_note_live(demo_model_dir: Path, tmp_path: Path) -> None:
    config = write_project(tmp_path, demo_model_dir, settings={"runtime": {"disable_radix_cache": True}})
    with start_runtime_server(demo_model_dir, *runtime_flags(config), log_dir=tmp_path) as server:
        found = live_findings(read_live(server.url))
    assert [(f.code, f.severity, f.source) for f in found] == [("RADIX_CACHE_OFF", "info", "live")]


def test_unreachable_server_is_one_error_line() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "hybridctl", "doctor", "--no-host", "--url", "http://127.0.0.1:9"],
        capture_output=True, text=True, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2 and "Traceback" not in res.stdout + res.stderr
    assert "cannot reach the server at http://127.0.0.1:9" in res.stdout
