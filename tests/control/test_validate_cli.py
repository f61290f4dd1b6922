"""`hybridctl validate` and `hybridctl schema` end to end: exit codes, output; no torch imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from config_files import with_model
from typer.testing import CliRunner

from hybridctl.cli import app

runner = CliRunner()


def files(tmp_path: Path, config: str, settings: str = "{}") -> list[str]:
    (tmp_path / "config.toml").write_text(with_model(tmp_path, config))
    (tmp_path / "settings.json").write_text(settings)
    return [str(tmp_path / "config.toml"), str(tmp_path / "settings.json")]


def test_valid_exits_0(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", *files(tmp_path, "[server]\nport = 8080\n")])
    assert result.exit_code == 0 and "valid" in result.output


def test_warnings_exit_1_only_with_strict(tmp_path: Path) -> None:
    paths = files(tmp_path, "", '{"mamba": {"state_snapshot_on_match": false}}')
    assert runner.invoke(app, ["validate", *paths]).exit_code == 0
    strict = runner.invoke(app, ["validate", *paths, "--strict"])
    assert strict.exit_code == 1 and "PREFIX_CACHE_MISS" in strict.output


def test_errors_exit_2_with_location_and_fix(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", *files(tmp_path, "[server]\nprot = 1\n")])
    assert result.exit_code == 2
    assert "config.toml:2:1" in result.output and "UNKNOWN_KEY" in result.output
    assert "fix: rename `prot` to `port`" in result.output


def test_json_report(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", *files(tmp_path, "[server]\nport = 0\n"), "--json"])
    assert result.exit_code == 2
    report = json.loads(result.output)
    assert report["valid"] is False and report["errors"] == 1
    finding = report["findings"][0]
    assert {"severity", "code", "file", "line", "column", "key", "message", "fix"} <= finding.keys()
    assert finding["code"] == "OUT_OF_RANGE" and finding["line"] == 2


def test_engine_version_option(tmp_path: Path) -> None:
    paths = files(tmp_path, '[server]\nengine = "sglang"\n[extra_engine_args]\nmamba-backend = "triton"\n')
    result = runner.invoke(app, ["validate", *paths, "--engine-version", "0.7.0", "--strict"])
    assert result.exit_code == 1 and "ENGINE_VERSION_UNKNOWN" in result.output


def test_default_paths_and_missing_config(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["validate"])
    assert result.exit_code == 2
    assert "config.toml does not exist" in result.output and "hybridctl init" in result.output


def test_subprocess_exit_code_and_no_traceback(tmp_path: Path) -> None:
    paths = files(tmp_path, "[server\nport = 1\n")
    proc = subprocess.run([sys.executable, "-m", "hybridctl", "validate", *paths], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "TOML_SYNTAX" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr


def test_schema_command(tmp_path: Path) -> None:
    printed = runner.invoke(app, ["schema", "--file", "config"])
    assert printed.exit_code == 0 and json.loads(printed.output)["title"] == "hybridctl config.toml"
    wrote = runner.invoke(app, ["schema", "--out", str(tmp_path)])
    assert wrote.exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.schema.json", "settings.schema.json"]
    again = runner.invoke(app, ["schema", "--out", str(tmp_path)])
    assert again.exit_code == 2 and "--force" in again.output
    assert runner.invoke(app, ["schema", "--out", str(tmp_path), "--force"]).exit_code == 0
    assert runner.invoke(app, ["schema", "--file", "nope"]).exit_code == 2
    assert runner.invoke(app, ["schema", "--docs"]).output.startswith("# Configuration reference")


def test_control_plane_never_imports_torch() -> None:
    code = (
        "import sys, hybridctl.cli, hybridctl.rules.cross_file, hybridctl.init.init_project;"
        "from hybridctl.rules.check import check_files;"
        "check_files('/nonexistent.toml', '/nonexistent.json');"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_help_works() -> None:
    proc = subprocess.run([sys.executable, "-m", "hybridctl", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    for command in ("init", "validate", "schema"):
        assert command in proc.stdout
