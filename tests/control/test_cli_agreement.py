"""Help, validation and behaviour say the same thing: what --help promises is accepted, what is refused is
refused before any work with the limit the help states, and a missing file is named as missing.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from hybridctl.cli import app
from hybridctl.launch.state import state_path_for

runner = CliRunner()


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_bench_max_concurrency_zero_means_no_limit_as_the_help_says() -> None:
    helptext = runner.invoke(app, ["bench", "--help"]).stdout
    assert "0: no limit" in helptext
    url = f"http://127.0.0.1:{_closed_port()}"
    # 0 passes validation: the run gets as far as the (absent) server.
    zero = runner.invoke(app, ["bench", "--url", url, "--max-concurrency", "0"])
    assert zero.exit_code == 2 and "cannot reach" in zero.output, zero.output
    negative = runner.invoke(app, ["bench", "--url", url, "--max-concurrency", "-1"])
    assert negative.exit_code == 2 and "cannot reach" not in negative.output
    assert "0" in negative.output and "must be >= 1" not in negative.output, negative.output


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--num-groups", "0"], "--num-groups"),
        (["--dataset", "random", "--num-prompts", "0"], "--num-prompts"),
        (["--dataset", "random", "--range-ratio", "0"], "--range-ratio"),
    ],
)
def test_bench_shape_limits_are_checked_before_connecting(args: list[str], flag: str) -> None:
    result = runner.invoke(app, ["bench", "--url", f"http://127.0.0.1:{_closed_port()}", *args])
    assert result.exit_code == 2 and flag in result.output, result.output
    assert "cannot reach" not in result.output


def _hybridctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hybridctl", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", ["status", "stop"])
def test_status_and_stop_name_a_missing_config(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "nope.toml"
    proc = _hybridctl(command, str(missing))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert str(missing) in out and "does not exist" in out and "Fix:" in out, out
    assert "state file" not in out and "Traceback" not in out


def test_status_still_reads_the_state_of_a_config_deleted_after_launch(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    state = state_path_for(config)
    state.parent.mkdir()
    state.write_text("{}")  # corrupt on purpose: read (and named), not skipped as "no config"
    proc = _hybridctl("status", str(config), "--json")
    assert proc.returncode == 2 and str(state) in proc.stderr and "does not exist" not in proc.stderr


def test_status_of_an_existing_config_with_nothing_launched_is_not_running(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("")
    proc = _hybridctl("status", str(config), "--json")
    assert proc.returncode == 3 and json.loads(proc.stdout)["running"] is False


def _options() -> list[tuple[str, Any]]:
    """(command, parameter) for every command; typer may bring its own click, so groups are found by shape."""
    out: list[tuple[str, Any]] = []

    def walk(cmd: Any, name: str) -> None:
        if hasattr(cmd, "commands"):
            for sub_name, sub in cmd.commands.items():
                walk(sub, f"{name} {sub_name}".strip())
        else:
            out.extend((name, p) for p in cmd.params)

    walk(typer.main.get_command(app), "")
    return out


def test_every_value_a_help_text_gives_a_meaning_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # "(0: no limit)" promises that 0 is taken: neither the option's range nor the command's own checks may
    # refuse it. Each command runs with that value (against a closed port where it takes --url) and must fail,
    # if at all, for another reason.
    monkeypatch.chdir(tmp_path)
    url = f"http://127.0.0.1:{_closed_port()}"
    promised = []
    options = _options()
    for command, param in options:
        for m in re.finditer(r"\((-?\d+(?:\.\d+)?|inf): ", getattr(param, "help", None) or ""):
            flag, value = param.opts[0], m.group(1)
            promised.append((command, flag, value))
            args = [*command.split(), flag, value]
            if any(p.opts[0] == "--url" for c, p in options if c == command):
                args += ["--url", url]
            out = runner.invoke(app, args).output
            assert "Invalid value" not in out and f"{flag} must" not in out, (args, out)
    assert ("bench", "--max-concurrency", "0") in promised and len(promised) >= 3


def _builtin_project(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    qwen = Path(__file__).resolve().parents[2] / "templates" / "models" / "qwen3-next-80b-a3b.json"
    (model / "config.json").write_text(qwen.read_text(encoding="utf-8"), encoding="utf-8")
    config = tmp_path / "config.toml"
    config.write_text(f'[server]\nmodel_path = {json.dumps(str(model))}\nengine = "builtin"\n')
    return config


def test_plan_takes_the_memory_budget_its_fix_names(tmp_path: Path) -> None:
    config = _builtin_project(tmp_path)
    small = runner.invoke(app, ["plan", str(config), "--json"])
    assert small.exit_code == 1
    error = json.loads(small.stdout)["error"]
    assert "--memory-budget-gib of plan" in error  # what the fix says ...
    big = runner.invoke(app, ["plan", str(config), "--json", "--memory-budget-gib", "400"])
    assert big.exit_code == 0, big.output  # ... works: 80B of weights fit in 400 GiB
    assert json.loads(big.stdout)["fits"] is True
    sglang = runner.invoke(app, ["plan", str(config), "--engine", "sglang", "--gpu-mem-gib", "80",
                                 "--memory-budget-gib", "40"])  # fmt: skip
    assert sglang.exit_code == 2 and "--memory-budget-gib" in sglang.output and "--gpu-mem-gib" in sglang.output


def test_plan_reports_options_the_runtime_sizing_does_not_use(tmp_path: Path) -> None:
    config = _builtin_project(tmp_path)
    args = ["plan", str(config), "--memory-budget-gib", "400", "--sglang-version", "0.5.6"]
    out = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert [i["option"] for i in out["ignored_options"]] == ["--sglang-version"]
    assert "--sglang-version ignored" in runner.invoke(app, args).output


def test_verify_passed_names_the_checks_that_did_not_run() -> None:
    from io import StringIO

    from rich.console import Console

    from hybridctl.verify.render import render_report
    from hybridctl.verify.report import CheckResult, VerifyReport

    def verdict(*checks: CheckResult) -> str:
        out = StringIO()
        render_report(VerifyReport("http://127.0.0.1:30000", list(checks)), Console(file=out, width=200))
        return out.getvalue().strip().splitlines()[-1]

    ran = CheckResult("basic", "passed", "model matches config")
    skipped = CheckResult("spec", "skipped", "skipped: the server runs without speculative decoding")
    assert verdict(ran) == "verify: PASSED"
    assert verdict(ran, skipped) == "verify: PASSED (1 check skipped: spec)"
