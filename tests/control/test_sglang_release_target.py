"""Which SGLang release commands judge: --sglang-version, installed sglang, config.toml's server.sglang_version;
and validate / plan / launch say which, with the release's own findings and arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridctl.cli import app
from hybridctl.config.schema import HybridConfig
from hybridshared.flags.sglang_version import VersionError, resolve_release

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
ARTICLE_SETTINGS = '{"mamba": {"state_dtype": "float16"}}'


def files(tmp_path: Path, config: str, settings: str = "{}") -> list[str]:
    model = tmp_path / "qwen3-next"  # launch refuses a model_path that does not exist
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text((REPO / "templates" / "models" / "qwen3-next-80b-a3b.json").read_text())
    (tmp_path / "config.toml").write_text(f'[server]\nmodel_path = "{model}"\n' + config)
    (tmp_path / "settings.json").write_text(settings)
    return [str(tmp_path / "config.toml"), str(tmp_path / "settings.json")]


def test_the_flag_wins_over_the_config_key_and_the_key_over_the_newest() -> None:
    assert resolve_release("0.5.10", "0.5.6", "0.5.23") == ("0.5.10", "--sglang-version")
    assert resolve_release(None, "0.5.6", "0.5.23") == ("0.5.6", "config.toml [server] sglang_version")
    assert resolve_release(None, None, "0.5.23") == ("0.5.23", "newest release hybridctl holds")
    with pytest.raises(VersionError):
        resolve_release("latest", None, "0.5.23")


def test_the_key_is_in_the_schema_and_refuses_nonsense() -> None:
    assert HybridConfig.model_validate({"config": {"server": {"sglang_version": "0.5.6"}}})
    with pytest.raises(ValueError, match="sglang_version"):
        HybridConfig.model_validate({"config": {"server": {"sglang_version": "latest"}}})


def test_validate_judges_the_configured_release_and_names_it(tmp_path: Path) -> None:
    paths = files(tmp_path, 'sglang_version = "0.5.6"\n', ARTICLE_SETTINGS)
    result = runner.invoke(app, ["validate", *paths])
    assert result.exit_code == 2, result.output
    assert "judged for SGLang 0.5.6 (config.toml [server] sglang_version)" in result.output
    assert "SGLANG_RELEASE_VALUE" in result.output and "SGLang 0.5.6's --mamba-ssm-dtype" in result.output
    assert '"state_dtype": "bfloat16"' in result.output
    # the flag wins: 0.5.10 takes float16
    newer = runner.invoke(app, ["validate", *paths, "--sglang-version", "0.5.10", "--json"])
    report = json.loads(newer.output)
    assert report["sglang_release"] == "0.5.10" and report["sglang_release_source"] == "--sglang-version"
    assert not [f for f in report["findings"] if f["code"].startswith("SGLANG_RELEASE_VALUE")]


def test_launch_dry_run_writes_the_configured_releases_flags(tmp_path: Path) -> None:
    paths = files(tmp_path, 'sglang_version = "0.5.10"\n[cache]\nmamba_radix_cache_strategy = "extra_buffer"\n')
    result = runner.invoke(app, ["launch", paths[0], "--engine", "sglang", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "sglang 0.5.10" in result.output
    assert "--mamba-scheduler-strategy extra_buffer" in result.output
    assert "--mamba-radix-cache-strategy" not in result.output


def test_plan_follows_the_releases_sizing_code(tmp_path: Path) -> None:
    model = str(REPO / "templates" / "models" / "qwen3-next-80b-a3b.json")
    args = ["plan", "--model", model, "--pool-gib", "40", "--json"]
    old = json.loads(runner.invoke(app, [*args, "--sglang-version", "0.5.6"]).output)
    new = json.loads(runner.invoke(app, [*args, "--sglang-version", "0.5.23"]).output)
    assert (old["sglang_release"], old["sizing_code"]) == ("0.5.6", "model_runner")
    assert new["sizing_code"] == "kv_cache_configurator"
    # 0.5.6 charges no padding slot to the budget and has no strategies (3 slots per request, overlap off)
    assert old["slots_per_request"] == 3 and old["overlap_schedule"] is False
    assert old["max_mamba_cache_size"] == new["max_mamba_cache_size"] + 1


@pytest.mark.parametrize(
    ("arch", "version", "warned"),
    [
        ("Qwen3NextForCausalLM", "0.5.6", True),  # server_args.py: overlap off with MambaRadixCache
        ("Qwen3NextForCausalLM", "0.5.7", False),  # fixed for Qwen3-Next in 0.5.7 ...
        ("NemotronHForCausalLM", "0.5.8", True),  # ... not yet for Nemotron-H
        ("NemotronHForCausalLM", "0.5.9", False),
        ("KimiLinearForCausalLM", "0.5.6", True),  # radix cache off for Kimi-Linear
    ],
)
def test_what_a_release_silently_changes_is_a_warning_for_the_models_it_hits(
    tmp_path: Path, arch: str, version: str, warned: bool
) -> None:
    from hybridctl.rules.cross_file import check_rules

    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch]}))
    cfg = HybridConfig.model_validate({"config": {"server": {"model_path": str(tmp_path)}}})
    found = [f for f in check_rules(cfg, version) if f.code == "SGLANG_RELEASE_CHANGES"]
    assert bool(found) is warned, [f.message for f in found]
    if warned:
        assert f"SGLang {version}" in found[0].message and arch in found[0].message
        assert found[0].severity == "warning"


def test_0_5_6_ignoring_max_mamba_cache_size_with_the_radix_cache_is_a_warning() -> None:
    from hybridctl.rules.cross_file import check_rules

    cfg = HybridConfig.model_validate({"config": {"memory": {"max_mamba_cache_size": 300}}})
    keys = {f.key for f in check_rules(cfg, "0.5.6") if f.code == "SGLANG_RELEASE_CHANGES"}
    assert "memory.max_mamba_cache_size" in keys
    assert not [f for f in check_rules(cfg, "0.5.10") if f.code == "SGLANG_RELEASE_CHANGES"]
