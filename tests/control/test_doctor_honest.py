"""doctor is honest: a check that could not run is skipped with its reason, never ✓ (predictions that need a
skipped input included); the summary counts what was skipped; options that do not apply are reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from hybridctl.doctor.run import DoctorOptions, run_doctor
from hybridctl.host.facts import GpuFacts, HostFacts, SglangFacts, TorchBuild

REPO = Path(__file__).resolve().parents[2]
QWEN3_NEXT = REPO / "templates" / "models" / "qwen3-next-80b-a3b.json"
LOGS = Path(__file__).parent / "data" / "logs"
GIB = 1 << 30
FAILURE_MODES = ("State pool", "Prefix cache", "Speculative decoding", "Elastic pool", "PD disaggregation")
# The keys `doctor --json` has always had; additions are allowed, renames are not.
JSON_KEYS = {"checks", "findings", "startup", "summary", "exit_code"}


def doctor(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hybridctl", "doctor", "--no-host", *args],
        input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True, text=True, cwd=cwd, timeout=120,
    )  # fmt: skip


def marks(out: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["name"]: (c["status"], c["summary"]) for c in out["checks"]}


def test_no_config_skips_every_prediction_and_reports_the_unused_gpu_size(tmp_path: Path) -> None:
    res = doctor("--gpu-mem-gib", "80", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert JSON_KEYS <= out.keys()
    m = marks(out)
    for name in FAILURE_MODES:
        status, summary = m[name]
        assert status == "skipped" and "no config" in summary, (name, summary)
    assert out["skipped"] == sum(c["status"] == "skipped" for c in out["checks"]) >= 6
    (ignored,) = out["ignored_options"]
    assert ignored["option"] == "--gpu-mem-gib"
    assert f"no config.toml found at {tmp_path / 'config.toml'}" in ignored["reason"]
    assert "No issues found!" not in out["summary"] and f"{out['skipped']} checks skipped" in out["summary"]

    text = doctor("--gpu-mem-gib", "80", cwd=tmp_path).stdout
    assert "[✓] State pool" not in text and "[-] State pool" in text
    assert "--gpu-mem-gib  ignored: no config.toml found at" in text and "1 option ignored" in text


def _unsized_project(tmp_path: Path) -> Path:
    config = tmp_path / "config.toml"
    config.write_text('[server]\nengine = "sglang"\n')  # no model_path: nothing to size
    return config


def test_unsized_pools_skip_the_state_pool_prediction_never_a_tick(tmp_path: Path) -> None:
    config = _unsized_project(tmp_path)
    res = doctor(str(config), "--gpu-mem-gib", "80", "--json", cwd=tmp_path)
    out = json.loads(res.stdout)
    m = marks(out)
    assert m["Model"][0] == "skipped"
    assert m["State pool"] == ("skipped", "skipped: the pools were not sized (see Model); no log or server was "
                               "read either")  # fmt: skip
    # The config's own rules did run: the other modes are judged from it.
    assert m["Prefix cache"][0] == "ok" and "from the config" in m["Prefix cache"][1]
    assert [i["option"] for i in out["ignored_options"]] == ["--gpu-mem-gib"]
    assert "the pools were not sized" in out["ignored_options"][0]["reason"]
    assert "checks skipped" in out["summary"]


def test_a_log_judges_what_the_unsized_config_could_not(tmp_path: Path) -> None:
    config = _unsized_project(tmp_path)
    log = (LOGS / "runtime_snapshot_off.log").read_text(encoding="utf-8")
    out = json.loads(doctor(str(config), "--log", "-", "--json", "-v", cwd=tmp_path, stdin=log).stdout)
    pool = next(c for c in out["checks"] if c["name"] == "State pool")
    assert pool["status"] == "ok" and pool["summary"] == "no MAMBA_POOL_ALLOC predicted from the log"
    assert pool["details"] == ["not judged: not from the config: the pools were not sized (see Model)"]


def test_yes_without_fix_is_reported(tmp_path: Path) -> None:
    out = json.loads(doctor("--yes", "--json", cwd=tmp_path).stdout)
    assert {"option": "--yes", "reason": "only --fix asks for a confirmation"} in out["ignored_options"]


def test_peer_without_a_config_is_reported(tmp_path: Path) -> None:
    peer = tmp_path / "peer.toml"
    peer.write_text("")
    out = json.loads(doctor("--peer", str(peer), "--json", cwd=tmp_path).stdout)
    assert [i["option"] for i in out["ignored_options"]] == ["--peer"]


def test_a_run_where_every_check_ran_still_says_no_issues(tmp_path: Path) -> None:
    # The control: nothing skipped, nothing ignored, nothing wrong -> the plain verdict.
    model = tmp_path / "model"  # a directory with config.json: what the engine loads
    model.mkdir()
    (model / "config.json").write_text(QWEN3_NEXT.read_text(encoding="utf-8"), encoding="utf-8")
    config = tmp_path / "config.toml"
    config.write_text(f'[server]\nmodel_path = {json.dumps(str(model))}\nengine = "sglang"\ntp_size = 4\n')
    gpus = tuple(GpuFacts(i, "NVIDIA H100 80GB HBM3", (9, 0), 80 * GIB, 79 * GIB, True) for i in range(4))
    host = HostFacts("550.54.15", (12, 4), gpus, TorchBuild("2.13.0+cu124", "12.4"),
                     SglangFacts("0.5.23", True, False, True, True), c_compiler="/usr/bin/cc")  # fmt: skip
    report = run_doctor(DoctorOptions(config, tmp_path / "settings.json", True), host)
    assert [c.name for c in report.checks if c.status == "skipped"] == []
    assert report.summary() == "No issues found!", [f.cause for f in report.findings]
    pool = next(c for c in report.checks if c.name == "State pool")
    assert pool.status == "ok" and pool.summary.endswith("from the config and the host")


def test_config_line_is_not_a_tick_above_the_errors_validate_finds_in_it(tmp_path: Path) -> None:
    # init without --model loads fine but has nothing to serve: MODEL_PATH_MISSING, an error validate reports too
    init = subprocess.run(
        [sys.executable, "-m", "hybridctl", "init", "--out", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert init.returncode == 0, init.stderr
    res = doctor("--json", cwd=tmp_path)
    out = json.loads(res.stdout)
    status, summary = marks(out)["Config"]
    assert (status, res.returncode) == ("error", 2)
    assert "MODEL_PATH_MISSING" in summary
    assert "MODEL_PATH_MISSING" in {f["code"] for f in out["findings"] if f["severity"] == "error"}
