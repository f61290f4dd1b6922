"""`hybridctl doctor` as a user runs it: a subprocess, real files, stdin, exit codes 0 / 1 / 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOGS = Path(__file__).parent / "data" / "logs"
QWEN3_NEXT = REPO / "templates" / "models" / "qwen3-next-80b-a3b.json"

CONFIG = """\
# A Qwen3-Next server on four 80 GiB GPUs.
[server]
model_path = "model"
engine = "sglang"
tp_size = 4

[memory]
max_mamba_cache_size = 4  # too few for 8 requests
"""
SETTINGS = {"runtime": {"max_running_requests": 8}, "mamba": {"state_snapshot_on_match": False}}


def doctor(*args: str, stdin: str | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hybridctl", "doctor", "--no-host", *args],
        input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True, text=True, cwd=cwd, timeout=120,
    )  # fmt: skip


def project(tmp_path: Path) -> Path:
    """config.toml + settings.json beside a model directory (a real config.json: engines load directories)."""
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text(QWEN3_NEXT.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "config.toml").write_text(CONFIG, encoding="utf-8")
    (tmp_path / "settings.json").write_text(json.dumps(SETTINGS, indent=4) + "\n", encoding="utf-8")
    return tmp_path / "config.toml"


def test_a_run_with_nothing_to_check_exits_0_and_says_what_it_skipped(tmp_path: Path) -> None:
    res = doctor(cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[-] Config" in res.stdout and "No issues found!" not in res.stdout
    assert "10 checks skipped" in res.stdout, res.stdout


def test_log_on_stdin_json_shape_and_exit_2() -> None:
    text = (LOGS / "sglang_mamba_alloc_tp2.log").read_text(encoding="utf-8")
    res = doctor("--log", "-", "--json", stdin=text)
    assert res.returncode == 2, res.stderr
    out = json.loads(res.stdout)
    assert out["startup"] == {"max_mamba_cache_size": 6, "kv_tokens": 1245184, "max_running_requests": 8}
    (f,) = out["findings"]
    assert {k: f[k] for k in ("code", "severity", "line")} == {
        "code": "MAMBA_POOL_ALLOC",
        "severity": "error",
        "line": 25,
    }
    assert (
        f["evidence"].startswith("AssertionError: Not enough space for mamba cache")
        and f["cause"]
        and f["fix"]
    )
    marks = {c["name"]: c["status"] for c in out["checks"]}
    assert marks["State pool"] == "error" and marks["Prefix cache"] == "ok"


def test_warning_only_log_exits_1() -> None:
    res = doctor("--log", str(LOGS / "runtime_snapshot_off.log"))
    assert res.returncode == 1, res.stdout
    assert "[!] Prefix cache" in res.stdout and "PREFIX_CACHE_MISS" in res.stdout


def test_radix_cache_off_by_choice_is_a_note_and_exits_0() -> None:
    res = doctor("--log", str(LOGS / "sglang_radix_disabled.log"))
    assert res.returncode == 0, res.stdout
    assert "RADIX_CACHE_OFF" in res.stdout and "[✓] Prefix cache" in res.stdout


def test_missing_log_is_one_clear_line_not_a_traceback() -> None:
    res = doctor("--log", "/nonexistent/server.log")
    assert res.returncode == 2
    assert (
        res.stderr.strip()
        == "error: --log /nonexistent/server.log: cannot read it (No such file or directory)."
    )


def test_broken_config_is_reported_as_a_check(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("[server\nport = 1\n", encoding="utf-8")
    res = doctor("-v", cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stdout + res.stderr
    assert "[✗] Config" in res.stdout and "TOML_SYNTAX" in res.stdout


def test_prediction_then_fix_round_trip(tmp_path: Path) -> None:
    config = project(tmp_path)
    before = config.read_text(encoding="utf-8")
    res = doctor("--gpu-mem-gib", "80", cwd=tmp_path)
    assert res.returncode == 2
    assert "MAMBA_POOL_ALLOC" in res.stdout and "PREFIX_CACHE_MISS" in res.stdout
    assert "Set memory.max_mamba_cache_size = 40 in config.toml" in res.stdout

    refused = doctor("--gpu-mem-gib", "80", "--fix", cwd=tmp_path)  # stdin is not a terminal, no --yes
    assert refused.returncode == 2 and "pass --yes" in refused.stderr
    assert config.read_text(encoding="utf-8") == before

    fixed = doctor("--gpu-mem-gib", "80", "--fix", "--yes", cwd=tmp_path)
    assert "+max_mamba_cache_size = 40  # too few for 8 requests" in fixed.stdout
    assert '+        "state_snapshot_on_match": true' in fixed.stdout
    text = config.read_text(encoding="utf-8")
    assert (
        text.startswith("# A Qwen3-Next server on four 80 GiB GPUs.") and "# too few for 8 requests" in text
    )
    settings = (tmp_path / "settings.json").read_text(encoding="utf-8")
    assert json.loads(settings)["mamba"]["state_snapshot_on_match"] is True and '\n    "runtime"' in settings

    again = doctor("--gpu-mem-gib", "80", cwd=tmp_path)
    assert again.returncode == 0, again.stdout


def test_json_fix_requires_yes(tmp_path: Path) -> None:
    project(tmp_path)
    res = doctor("--gpu-mem-gib", "80", "--fix", "--json", cwd=tmp_path)
    assert res.returncode == 2 and "--yes" in res.stderr
    ok = doctor("--gpu-mem-gib", "80", "--fix", "--json", "--yes", cwd=tmp_path)
    out = json.loads(ok.stdout)
    assert sorted(Path(e["path"]).name for e in out["fixed"]) == ["config.toml", "settings.json"]


def test_fix_without_a_config_file(tmp_path: Path) -> None:
    res = doctor("--fix", "--yes", cwd=tmp_path)
    assert res.returncode == 2 and "does not exist" in res.stderr


def test_config_findings_point_at_the_key_line(tmp_path: Path) -> None:
    project(tmp_path)
    out = json.loads(doctor("--gpu-mem-gib", "80", "--json", cwd=tmp_path).stdout)
    lines = {(f["code"], f["changes"][0]["key"]): f["line"] for f in out["findings"] if f["changes"]}
    assert lines[("MAMBA_POOL_ALLOC", "memory.max_mamba_cache_size")] == 8  # config.toml line 8
    assert lines[("PREFIX_CACHE_MISS", "mamba.state_snapshot_on_match")] == 6  # settings.json, indent 4


def test_the_whole_doctor_never_imports_torch(tmp_path: Path) -> None:
    config = project(tmp_path)
    log = LOGS / "sglang_mamba_alloc_tp2.log"
    code = (
        "import sys\n"
        "from hybridctl.cli import app\n"
        f"args = ['doctor', '-c', {str(config)!r}, '--log', {str(log)!r}, '--gpu-mem-gib', '80', '-v']\n"
        "try:\n    app(args, standalone_mode=False)\nexcept SystemExit:\n    pass\n"
        "print('TORCH' if any(m == 'torch' or m.startswith('torch.') for m in sys.modules) else 'CLEAN')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert "MAMBA_POOL_ALLOC" in res.stdout, res.stderr[-2000:]  # the doctor really ran: config, log, host
    assert res.stdout.strip().endswith("CLEAN"), res.stdout[-500:]
