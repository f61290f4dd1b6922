"""The CLI speaks one way everywhere: help texts reach the screen whole, and every command that reads the two files
takes them positionally (`hybridctl CMD config.toml settings.json`) or as `--config config.toml --settings
settings.json`, the form the articles use.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.core
import typer.main
from typer.testing import CliRunner, Result

from hybridctl.cli import app

runner = CliRunner()


def _commands() -> Iterator[tuple[list[str], Any]]:
    def walk(path: list[str], command: Any) -> Iterator[tuple[list[str], Any]]:
        yield path, command
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk([*path, name], sub)

    yield from walk([], typer.main.get_command(app))


def _flat(text: str) -> str:
    return " ".join(text.split())


ALL = list(_commands())


@pytest.mark.parametrize("path, command", ALL, ids=[" ".join(p) or "hybridctl" for p, _ in ALL])
def test_every_help_text_survives_rendering(path: list[str], command: Any) -> None:
    # Rich markup would drop "[server]" from "(default: [server] engine ...)" and "[len*ratio, len]" entirely.
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "10000"}, terminal_width=10000)
    assert result.exit_code == 0, result.output
    shown = _flat(result.output)
    texts = [p.help for p in command.params if getattr(p, "help", None)]
    texts += [command.help.split("\n\n")[0]] if command.help else []
    assert texts or not path
    for text in texts:
        assert _flat(text) in shown, f"{' '.join(path)}: {text!r} is not shown whole"


def test_help_with_brackets_is_checked() -> None:
    # The texts the issue names: the check above covers them (they exist and hold brackets).
    bracketed = {
        (" ".join(path), p.opts[0])
        for path, command in ALL
        for p in command.params
        if "[" in (getattr(p, "help", None) or "")
    }
    assert {("launch", "--engine"), ("bench", "--url"), ("bench", "--range-ratio")} <= bracketed
    assert ("verify basic", "--url") in bracketed


FILE_COMMANDS = [
    ["validate"], ["plan"], ["launch"], ["doctor"], ["status"], ["stop"], ["bench"],
    ["verify", "all"], ["verify", "basic"], ["verify", "prefix-cache"], ["verify", "spec"],
]  # fmt: skip


@pytest.mark.parametrize("cmd", FILE_COMMANDS, ids=" ".join)
def test_every_file_reading_command_takes_both_forms(cmd: list[str]) -> None:
    command = typer.main.get_command(app)
    for name in cmd:
        command = command.commands[name]  # type: ignore[attr-defined]
    options = {opt for p in command.params for opt in p.opts}
    arguments = [p.name for p in command.params if isinstance(p, typer.core.TyperArgument)]
    assert {"--config", "--settings"} <= options
    assert arguments[:1] == ["config"]


def _files(tmp_path: Path, model_ok: bool = True) -> tuple[Path, Path]:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    config = tmp_path / "c.toml"
    config.write_text(f"[server]\nmodel_path = {json.dumps(str(model))}\nport = 31999\n")
    settings = tmp_path / "s.json"  # not the default name: only found when passed
    settings.write_text(json.dumps({"runtime": {"max_running_requests": 7}}))
    return config, settings


def _both_forms(tmp_path: Path, *cmd: str) -> tuple[Result, Result]:
    config, settings = _files(tmp_path)
    positional = runner.invoke(app, [*cmd, str(config), str(settings)])
    options = runner.invoke(app, [*cmd, "--config", str(config), "--settings", str(settings)])
    return positional, options


def test_validate_both_forms(tmp_path: Path) -> None:
    positional, options = _both_forms(tmp_path, "validate", "--json")
    assert positional.exit_code == options.exit_code
    assert json.loads(positional.stdout) == json.loads(options.stdout)
    assert json.loads(options.stdout)["settings_path"].endswith("s.json")


def test_launch_dry_run_both_forms(tmp_path: Path) -> None:
    positional, options = _both_forms(tmp_path, "launch", "--engine", "builtin", "--dry-run", "--json")
    assert positional.exit_code == options.exit_code == 0, positional.output + options.output
    argv = json.loads(options.stdout)["commands"][0]["argv"]
    assert argv == json.loads(positional.stdout)["commands"][0]["argv"]
    assert argv[argv.index("--max-running-requests") + 1] == "7"  # s.json was read


def test_doctor_takes_config_positionally(tmp_path: Path) -> None:
    positional, options = _both_forms(tmp_path, "doctor", "--no-host", "--json")
    assert positional.exit_code == options.exit_code, positional.output + options.output
    a, b = json.loads(positional.stdout), json.loads(options.stdout)
    assert [c["name"] for c in a["checks"]] == [c["name"] for c in b["checks"]]
    assert any(c["name"] == "Config" and c["status"] != "skipped" for c in a["checks"])


def test_status_and_stop_take_both_forms(tmp_path: Path) -> None:
    config, settings = _files(tmp_path)
    for cmd in (["status"], ["stop"]):
        a = runner.invoke(app, [*cmd, str(config)])
        b = runner.invoke(app, [*cmd, "--config", str(config), "--settings", str(settings)])
        assert a.exit_code == b.exit_code and a.stdout == b.stdout


def test_one_file_given_two_different_ways_is_an_error(tmp_path: Path) -> None:
    config, _settings = _files(tmp_path)
    result = runner.invoke(app, ["validate", str(config), "--config", str(tmp_path / "other.toml")])
    assert result.exit_code == 2 and "given twice" in result.output and "Traceback" not in result.output
    same = runner.invoke(app, ["validate", str(config), "--config", str(config)])
    assert same.exit_code in (0, 1) and "given twice" not in same.output
