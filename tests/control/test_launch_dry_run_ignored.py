"""`launch --dry-run` shows the command even when the engine would ignore settings, and lists each one (key, why);
the real launch refuses them unless --allow-ignored. Both engines; the article's own files for SGLang.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridctl.cli import app

ARTICLE = Path(__file__).parent / "data" / "article-files"
runner = CliRunner()


def _model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    return model


def _article(tmp_path: Path) -> Path:
    """The article's two files, its hub model swapped for a local directory (nothing is downloaded here)."""
    text = (ARTICLE / "config.toml").read_text()
    hub = 'model_path = "Qwen/Qwen3-Next-80B-A3B-Instruct-FP8"'
    assert hub in text
    config = tmp_path / "config.toml"
    config.write_text(text.replace(hub, f"model_path = {json.dumps(str(_model_dir(tmp_path)))}"))
    (tmp_path / "settings.json").write_text((ARTICLE / "settings.json").read_text())
    return config


def _builtin_ignores(tmp_path: Path) -> Path:
    # Data-parallel replicas: the bundled runtime serves from one device and has no such setting.
    config = tmp_path / "config.toml"
    model = json.dumps(str(_model_dir(tmp_path)))
    config.write_text(f'[server]\nmodel_path = {model}\nengine = "builtin"\ndp_size = 2\n')
    return config


CASES = {
    "sglang, the article": (_article, "sglang", "logging.log_mamba_state_stats", "sglang.launch_server"),
    "builtin": (_builtin_ignores, "builtin", "server.dp_size", "runtime"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_dry_run_prints_the_command_and_what_would_be_ignored(tmp_path: Path, case: str) -> None:
    make, engine, key, module = CASES[case]
    config = make(tmp_path)
    result = runner.invoke(app, ["launch", str(config), "--engine", engine, "--dry-run"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    ignored = [line for line in out.splitlines() if "would be ignored" in line]
    assert any(key in line for line in ignored), out
    assert "--allow-ignored" in out
    argv = shlex.split(out.rstrip("\n").splitlines()[-1])
    assert argv[1:3] == ["-m", module]

    as_json = runner.invoke(app, ["launch", str(config), "--engine", engine, "--dry-run", "--json"])
    assert as_json.exit_code == 0, as_json.output
    plan = json.loads(as_json.stdout)
    assert plan["launch_refuses_ignored"] is True
    entry = next(i for i in plan["ignored_keys"] if i["key"] == key)
    assert entry["reason"] and entry["file"] in ("config.toml", "settings.json")
    assert plan["commands"][-1]["argv"] == argv


@pytest.mark.parametrize("case", list(CASES))
def test_the_real_launch_refuses_what_would_be_ignored(tmp_path: Path, case: str) -> None:
    make, engine, key, _module = CASES[case]
    config = make(tmp_path)
    result = runner.invoke(app, ["launch", str(config), "--engine", engine])
    assert result.exit_code == 2, result.output
    assert key in result.output and "--allow-ignored" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / ".hybridctl").exists() and not (tmp_path / "hybridctl-server.log").exists()


def test_with_allow_ignored_the_dry_run_says_they_are_accepted(tmp_path: Path) -> None:
    config = _article(tmp_path)
    result = runner.invoke(app, ["launch", str(config), "--engine", "sglang", "--dry-run", "--allow-ignored"])
    assert result.exit_code == 0, result.output
    assert "ignored (--allow-ignored)" in result.stdout and "log_mamba_state_stats" in result.stdout
    plan = json.loads(
        runner.invoke(
            app, ["launch", str(config), "--engine", "sglang", "--dry-run", "--allow-ignored", "--json"]
        ).stdout
    )
    assert plan["launch_refuses_ignored"] is False


def test_a_dry_run_that_writes_the_yaml_and_manifests_is_not_stopped_by_ignored_keys(tmp_path: Path) -> None:
    config = _article(tmp_path)
    yaml_out, k8s_out = tmp_path / "sglang.yaml", tmp_path / "k8s.yaml"
    args = ["launch", str(config), "--engine", "sglang", "--dry-run", "--write-yaml", str(yaml_out)]
    result = runner.invoke(app, [*args, "--k8s", str(k8s_out)])
    assert result.exit_code == 0, result.output
    assert "logging.log_mamba_state_stats" in result.stdout  # still listed above the command
    assert "model-path:" in yaml_out.read_text() and k8s_out.read_text()
    # The ignored key has no flag, so the file the dry run wrote holds none for it.
    assert "mamba-state-stats" not in yaml_out.read_text()


def test_options_a_dry_run_does_not_use_are_noted_on_stderr(tmp_path: Path) -> None:
    config = _builtin_ignores(tmp_path)
    args = ["launch", str(config), "--engine", "builtin", "--dry-run", "--detach", "--k8s-image", "img", "--force"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    for flag in ("--detach", "--k8s-image", "--force"):
        assert f"note: {flag} ignored:" in result.stderr, result.stderr
    argv = shlex.split(result.stdout.rstrip("\n").splitlines()[-1])  # stdout's last line is still the command
    assert argv[1:3] == ["-m", "runtime"]
