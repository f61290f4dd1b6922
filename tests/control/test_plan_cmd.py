"""`hybridctl plan` end to end: real files, the real CLI app, JSON and human output, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridctl.cli import app
from hybridctl.config.schema import HybridConfig
from hybridctl.host.nvml import gpu_memory_bytes
from hybridctl.model.bundled import load_model_shape_or_bundled
from hybridctl.planner.plan import make_plan
from hybridshared.sizing.pool_sizing import GIB

TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "models"
QWEN3_NEXT = str(TEMPLATES / "qwen3-next-80b-a3b.json")
NEMOTRON = str(TEMPLATES / "nemotron-h-8b.json")

runner = CliRunner()


def _plan_json(*args: str) -> dict:
    result = runner.invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_matches_make_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no ./config.toml: defaults
    got = _plan_json("--model", QWEN3_NEXT, "--tp", "4", "--gpu-mem-gib", "80")
    want = make_plan(HybridConfig(), load_model_shape_or_bundled(QWEN3_NEXT, tp=4), gpu_mem_bytes=80 * GIB).to_dict()
    assert {k: got[k] for k in want} == want
    assert got["model"]["family"] == "qwen3_next" and got["model"]["num_kv_heads_per_rank"] == 1


def test_pool_bytes_gives_the_sglang_numbers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same figures tests/control/test_planner_sglang.py gets from SGLang's own code."""
    monkeypatch.chdir(tmp_path)
    args = ("--model", QWEN3_NEXT, "--pool-bytes", str(40 * GIB), "--mamba-ssm-dtype", "float32")
    got = _plan_json(*args)
    assert (got["max_mamba_cache_size"], got["max_running_requests"], got["max_total_num_tokens"]) == (
        262,
        52,
        920754,
    )
    assert got["mamba_state_bytes_per_request"] == 77_266_944 and got["pool_source"] == "given"
    no_overlap = _plan_json(*args, "--disable-overlap-schedule")
    assert (no_overlap["strategy"], no_overlap["max_running_requests"]) == ("no_buffer", 87)
    assert _plan_json("--model", QWEN3_NEXT, "--pool-gib", "40")["max_mamba_cache_size"] == 262


def test_human_output_has_table_and_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["plan", "--model", NEMOTRON, "--gpu-mem-gib", "80"])
    assert result.exit_code == 0, result.output
    assert "state slots (K)" in result.stdout and "KV tokens" in result.stdout
    assert "verdict:" in result.stdout and "concurrent requests" in result.stdout


def test_config_files_are_used_and_flags_win(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nmodel_path = "{QWEN3_NEXT}"\ntp_size = 4\n\n[memory]\nmamba_full_memory_ratio = 2.0\n'
    )
    (tmp_path / "settings.json").write_text(json.dumps({"runtime": {"max_running_requests": 32}}))
    got = _plan_json(str(config), "--gpu-mem-gib", "80")
    assert (got["tp"], got["mamba_full_memory_ratio"], got["max_running_requests"]) == (4, 2.0, 32)
    flagged = _plan_json(str(config), "--gpu-mem-gib", "80", "--tp", "8", "--mamba-full-memory-ratio", "0.5")
    assert (flagged["tp"], flagged["mamba_full_memory_ratio"]) == (8, 0.5)


@pytest.mark.skipif(gpu_memory_bytes() is not None, reason="NVML reports a GPU here: memory is detected")
def test_no_gpu_and_no_size_asks_for_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # engine auto on a GPU-less host is the bundled runtime, which cannot hold an 8B model in 4 GiB: it says so
    # and names the flag that plans an SGLang server instead.
    result = runner.invoke(app, ["plan", "--model", NEMOTRON])
    assert result.exit_code == 1
    assert "bundled runtime" in result.output and "--gpu-mem-gib" in result.output
    result = runner.invoke(app, ["plan", "--model", NEMOTRON, "--engine", "sglang"])
    assert result.exit_code == 2
    assert "--gpu-mem-gib" in result.output and "--pool-gib" in result.output


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["--model", QWEN3_NEXT, "--gpu-mem-gib", "80"], 1, "does not fit: The weights"),
        (["--model", NEMOTRON, "--pool-gib", "0.05"], 1, "does not fit: Not enough memory"),
        (["--model", NEMOTRON, "--pool-gib", "8", "--mamba-radix-cache-strategy", "no_buffer"], 1, "overlap"),
        (["--model", "/nonexistent/model"], 2, "no such file or directory"),
        (["--model", NEMOTRON, "--pool-gib", "8", "--pool-bytes", "100"], 2, "not both"),
        (
            ["--model", NEMOTRON, "--pool-gib", "8", "--mamba-ssm-dtype", "int4"],
            2,
            "--mamba-ssm-dtype 'int4'",
        ),
        (["missing-config.toml", "--model", NEMOTRON, "--pool-gib", "8"], 2, "no such config file"),
        (["--gpu-mem-gib", "80"], 2, "No model to plan for"),
    ],
)
def test_errors_are_one_paragraph_with_exit_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], code: int, text: str
) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["plan", *args])
    assert result.exit_code == code, result.output
    assert text in result.output
    assert "Traceback" not in result.output


def test_non_hybrid_model_is_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    result = runner.invoke(app, ["plan", "--model", str(tmp_path), "--gpu-mem-gib", "80"])
    assert result.exit_code == 2 and "'llama'" in result.output


def test_planning_never_imports_torch() -> None:
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from hybridctl.cli import app\n"
        f"r = CliRunner().invoke(app, ['plan', '--model', {NEMOTRON!r}, '--gpu-mem-gib', '80', '--json'])\n"
        "assert r.exit_code == 0, r.output\n"
        "import hybridctl.planner.recommend, hybridshared.model.weights\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
