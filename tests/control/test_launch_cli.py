"""`hybridctl launch --dry-run`, `status` and `stop` through the real CLI."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridctl.cli import app

runner = CliRunner()


def _model(tmp_path: Path) -> Path:
    """A model directory whose path has a space (validate refuses a model_path that does not exist)."""
    model = tmp_path / "models" / "my model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text("{}")
    return model


def _write_config(tmp_path: Path, body: str = "") -> Path:
    config = tmp_path / "config.toml"
    config.write_text(f'[server]\nmodel_path = "{_model(tmp_path)}"\nport = 31555\n{body}')
    return config


def test_dry_run_last_line_is_the_command_shell_quoted(tmp_path: Path) -> None:
    config = _write_config(tmp_path, '\n[cache]\nmamba_radix_cache_strategy = "no_buffer"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "hybridctl", "launch", str(config), "--engine", "builtin", "--dry-run"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout.strip().splitlines()[-1])
    assert argv[:3] == [sys.executable, "-m", "runtime"]
    assert argv[argv.index("--model-path") + 1] == str(_model(tmp_path))
    assert argv[argv.index("--port") + 1] == "31555"
    assert "--disable-overlap-schedule" in argv


def test_dry_run_sglang_and_json(tmp_path: Path) -> None:
    config = _write_config(tmp_path)
    result = runner.invoke(app, ["launch", str(config), "--engine", "sglang", "--dry-run"])
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.output.strip().splitlines()[-1])
    assert argv[1:3] == ["-m", "sglang.launch_server"] and "--mamba-radix-cache-strategy" in argv
    result = runner.invoke(
        app,
        ["launch", str(config), "--engine", "sglang", "--sglang-version", "0.5.10", "--dry-run", "--json"],
    )
    plan = json.loads(result.output)
    assert plan["version"] == "0.5.10" and "--mamba-scheduler-strategy" in plan["commands"][0]["argv"]


def test_dry_run_pd_prints_three_commands_router_last(tmp_path: Path) -> None:
    config = _write_config(tmp_path, "\n[pd]\nenable_pd_disaggregation = true\n")
    result = runner.invoke(app, ["launch", str(config), "--engine", "sglang", "--dry-run"])
    assert result.exit_code == 0, result.output
    commands = [line for line in result.output.splitlines() if line.startswith(sys.executable)]
    assert len(commands) == 3
    assert "--disaggregation-mode prefill" in commands[0] and "--disaggregation-mode decode" in commands[1]
    last = shlex.split(result.output.strip().splitlines()[-1])
    assert last[1:4] == ["-m", "sglang_router.launch_router", "--pd-disaggregation"]


def test_ignored_keys_exit_2_unless_allowed(tmp_path: Path) -> None:
    config = _write_config(tmp_path, "\n[cache]\nenable_dual_lru_eviction = false\n")
    result = runner.invoke(app, ["launch", str(config), "--engine", "sglang"])
    assert result.exit_code == 2
    assert "cache.enable_dual_lru_eviction" in result.output and "--allow-ignored" in result.output
    assert "Traceback" not in result.output
    # A dry run still shows the command, and what a launch would refuse (tests/control/test_launch_dry_run_ignored.py).
    result = runner.invoke(app, ["launch", str(config), "--engine", "sglang", "--dry-run"])
    assert result.exit_code == 0 and "would be ignored: config.toml cache.enable_dual_lru_eviction" in result.output
    result = runner.invoke(app, ["launch", str(config), "--engine", "sglang", "--dry-run", "--allow-ignored"])
    assert result.exit_code == 0 and "ignored (--allow-ignored)" in result.output


def test_bad_config_exits_2_with_the_validator_report(tmp_path: Path) -> None:
    config = _write_config(tmp_path, "\n[memory]\nmem_fraction_static = 3\n")
    result = runner.invoke(app, ["launch", str(config), "--dry-run"])
    assert result.exit_code == 2
    assert "mem_fraction_static" in result.output and "Traceback" not in result.output


def test_write_yaml_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    config = _write_config(tmp_path)
    out = tmp_path / "sglang.yaml"
    args = ["launch", str(config), "--engine", "sglang", "--dry-run", "--write-yaml", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    text = out.read_text()
    assert f'model-path: "{_model(tmp_path)}"' in text and "port: 31555" in text
    out.write_text("mine\n")
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "--force" in result.output and out.read_text() == "mine\n"
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0 and out.read_text() == text


def test_k8s_manifests_file(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    config = _write_config(tmp_path)
    out = tmp_path / "k8s.yaml"
    result = runner.invoke(app, ["launch", str(config), "--engine", "sglang", "--dry-run", "--k8s", str(out)])
    assert result.exit_code == 0, result.output
    kinds = [d["kind"] for d in yaml.safe_load_all(out.read_text()) if d]
    assert kinds == ["Deployment", "Service"]


def test_status_and_stop_without_a_server(tmp_path: Path) -> None:
    config = _write_config(tmp_path)
    result = runner.invoke(app, ["status", str(config)])
    assert result.exit_code == 3 and "not running" in result.output
    result = runner.invoke(app, ["status", str(config), "--json"])
    assert result.exit_code == 3 and json.loads(result.output)["running"] is False
    result = runner.invoke(app, ["stop", str(config)])
    assert result.exit_code == 0 and "nothing to stop" in result.output


def test_corrupt_state_file_is_a_clear_error(tmp_path: Path) -> None:
    config = _write_config(tmp_path)
    state = tmp_path / ".hybridctl" / "server.json"
    state.parent.mkdir()
    state.write_text("{not json")
    result = runner.invoke(app, ["status", str(config)])
    assert result.exit_code == 2 and str(state) in result.output and "Traceback" not in result.output


def test_launch_on_a_busy_port_exits_2_without_a_traceback(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "config.toml"
        config.write_text(f'[server]\nmodel_path = "{_model(tmp_path)}"\nport = {port}\n')
        result = runner.invoke(app, ["launch", str(config), "--engine", "builtin"])
    assert result.exit_code == 2, result.output
    assert "already in use" in result.output and "Traceback" not in result.output
