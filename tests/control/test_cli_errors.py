"""Bad input to every command: one `error:` paragraph on stderr, the documented exit code, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridctl.cli import app

runner = CliRunner()


def _hybridctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hybridctl", *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def test_status_json_error_goes_to_stderr_and_leaves_stdout_empty(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[server]\nmodel_path = "/models/m"\n')
    state = tmp_path / ".hybridctl" / "server.json"
    state.parent.mkdir()
    state.write_text("{not json")
    proc = _hybridctl("status", str(config), "--json", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""  # a --json consumer never parses an error message
    assert proc.stderr.startswith("error:") and str(state) in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", [["init", "--out"], ["schema", "--out"], ["demo", "--out"]])
def test_out_pointing_at_a_file_is_a_clear_error(tmp_path: Path, command: list[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("mine\n")
    proc = _hybridctl(*command, str(blocker), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"{blocker} is a file, not a directory" in proc.stderr
    assert blocker.read_text() == "mine\n"


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--port", "70000"],
        ["demo", "--port", "0"],
        ["stop", "config.toml", "--timeout", "-1"],
        ["plan", "--tp", "0"],
        ["bench", "--dataset", "nope"],
        ["schema", "--file", "nope"],
        ["launch", "config.toml", "--engine", "nope", "--dry-run"],
        ["launch", "config.toml", "--engine", "sglang", "--sglang-version", "abc", "--dry-run"],
        ["verify", "basic", "--url", "not-a-url"],
        ["verify", "basic", "--url", "http://[::1"],
        ["verify", "basic", "--url", "http://127.0.0.1:port"],
        ["bench", "--url", "http://"],
        ["verify", "prefix-cache", "--url", "http://127.0.0.1:9", "--trials", "0"],
        ["doctor", "--log", "missing.log"],
    ],
)
def test_bad_flag_values_exit_2_without_a_traceback(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "config.toml").write_text('[server]\nmodel_path = "/models/m"\n')
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        result = runner.invoke(app, args)
    finally:
        os.chdir(cwd)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert not (tmp_path / "hybridctl-demo").exists()  # refused before doing anything


@pytest.mark.parametrize("config_text", [None, "garbage = [\n", "[server]\nport = 'x'\n"])
def test_verify_and_bench_with_a_bad_config_exit_2(tmp_path: Path, config_text: str | None) -> None:
    config = tmp_path / "config.toml"
    if config_text is None:
        config.mkdir()  # a directory where the file should be
    else:
        config.write_text(config_text)
    for args in (["verify", "basic", "--config", str(config)], ["bench", "--config", str(config), "--json"]):
        proc = _hybridctl(*args, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == "" and proc.stderr.startswith("error:") and "Traceback" not in proc.stderr


def test_verify_json_against_an_unreachable_server_prints_a_json_report(tmp_path: Path) -> None:
    proc = _hybridctl("verify", "basic", "--url", "http://127.0.0.1:9", "--json", cwd=tmp_path)
    assert proc.returncode == 2
    report = json.loads(proc.stdout)
    assert report["passed"] is False and "cannot reach" in report["error"]
    assert "Traceback" not in proc.stderr


def test_validate_checks_the_settings_beside_the_config_not_the_cwd(tmp_path: Path) -> None:
    # launch, plan, doctor and verify all read the settings.json beside config.toml; validate must check that one.
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.toml").write_text('[server]\nmodel_path = "/models/m"\n')
    (project / "settings.json").write_text('{"runtime": {"max_running_requests": -5}}')
    proc = _hybridctl("validate", str(project / "config.toml"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout
    assert str(project / "settings.json") in proc.stdout and "max_running_requests" in proc.stdout


def test_startup_failure_names_a_single_server_once() -> None:
    from hybridctl.launch.process import StartupFailed

    single = str(StartupFailed("server", "exited with code 2 during start-up", Path("s.log"), ["boom"]))
    assert single.startswith("the server exited with code 2") and "server server" not in single
    assert str(StartupFailed("prefill", "exited", Path("p.log"), [])).startswith("the prefill server exited")


def test_truncated_toml_names_the_unclosed_value_not_a_nul_character(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[server]\nmodel_path = "/m"\n[extra_engine_args]\nfoo = [1,\n')
    proc = _hybridctl("validate", str(config), cwd=tmp_path)
    assert proc.returncode == 2
    assert "TOML_SYNTAX" in proc.stdout and "ends inside a value" in proc.stdout and "x00" not in proc.stdout


def test_plan_with_a_directory_as_config_says_so(tmp_path: Path) -> None:
    proc = _hybridctl("plan", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2 and "is a directory, not a config file" in proc.stderr
