"""`hybridctl verify upstream` against two real runtimes: the local one and a second one standing in for
settings.json's `api` gateway, which requires a key (--api-key-env). Same weights: greedy answers match."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridctl.verify.upstream import agreeing_prefix
from tests.runtime.conftest import RunningServer, start_runtime_server
from tests.runtime.test_verify_live import as_json, check, hybridctl

KEY_VAR = "HYBRIDCTL_TEST_UPSTREAM_KEY"
KEY = "upstream-s3cret-4242"


@pytest.fixture(scope="module")
def gateway(demo_model_dir: Path) -> Iterator[RunningServer]:
    with start_runtime_server(
        demo_model_dir, "--api-key-env", KEY_VAR, "--served-model-name", "gateway-model",
        "--memory-budget-gib", "1", env={KEY_VAR: KEY},
    ) as server:  # fmt: skip
        yield server


def _files(tmp_path: Path, local: RunningServer, model_dir: Path, api: dict[str, object]) -> Path:
    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = {local.port}\nmodel_path = "{model_dir}"\nengine = "builtin"\n'
    )
    (tmp_path / "settings.json").write_text(json.dumps({"api": api}))
    return config


def test_same_weights_agree_and_the_key_stays_secret(
    runtime_server: RunningServer, gateway: RunningServer, demo_model_dir: Path, tmp_path: Path
) -> None:
    api = {"base_url": gateway.url + "/v1", "api_key_env": KEY_VAR, "timeout_seconds": 60}
    config = _files(tmp_path, runtime_server, demo_model_dir, api)
    proc = hybridctl("verify", "upstream", "--config", str(config), "--json", "--same-weights", "--prompts", "3",
                     env={KEY_VAR: KEY})  # fmt: skip
    report = as_json(proc)
    assert proc.returncode == 0, json.dumps(report, indent=1)[:3000]
    result = check(report, "upstream")
    m = result["measurements"]
    assert result["status"] == "passed" and m["identical_answers"] == 3
    assert m["upstream_model"] == "gateway-model" and m["upstream_url"] == gateway.url + "/v1"
    for row in m["prompts"]:
        for side in ("local", "upstream"):
            assert row[side]["answered"] and row[side]["latency_ms"] > 0 and row[side]["completion_tokens"] >= 1
        assert row["local"]["text"] == row["upstream"]["text"] and row["agreeing_prefix"] == 1.0
    assert KEY not in proc.stdout + proc.stderr
    table = hybridctl("verify", "upstream", "--config", str(config), "--prompts", "2", env={KEY_VAR: KEY})
    assert table.returncode == 0 and "upstream:" in table.stdout and "identical" in table.stdout
    assert KEY not in table.stdout + table.stderr


def test_a_wrong_key_or_an_unset_variable_is_a_target_problem(
    runtime_server: RunningServer, gateway: RunningServer, demo_model_dir: Path, tmp_path: Path
) -> None:
    api = {"base_url": gateway.url + "/v1", "api_key_env": KEY_VAR}
    config = _files(tmp_path, runtime_server, demo_model_dir, api)
    proc = hybridctl("verify", "upstream", "--config", str(config), env={KEY_VAR: ""})
    assert proc.returncode == 2 and f"export {KEY_VAR}=" in proc.stderr
    proc = hybridctl("verify", "upstream", "--config", str(config), "--json", env={KEY_VAR: "wrong-key"})
    assert proc.returncode == 2 and "401" in as_json(proc)["error"]
    assert "wrong-key" not in proc.stdout + proc.stderr


def test_different_weights_answer_but_fail_same_weights(
    runtime_server: RunningServer, demo_model_dir: Path, tmp_path: Path
) -> None:
    from runtime.demo_model import build_demo_model

    other = build_demo_model(tmp_path / "other-weights", seed=7)
    with start_runtime_server(other, "--memory-budget-gib", "1") as different:
        api = {"base_url": different.url + "/v1"}
        config = _files(tmp_path, runtime_server, demo_model_dir, api)
        loose = as_json(hybridctl("verify", "upstream", "--config", str(config), "--json", "--prompts", "2"))
        assert loose["passed"] is True  # both answered; agreement is reported, not required
        strict = hybridctl("verify", "upstream", "--config", str(config), "--json", "--prompts", "2", "--same-weights")
        report = as_json(strict)
        assert strict.returncode == 1 and "greedy answers differ" in check(report, "upstream")["reasons"][0]


def test_no_gateway_configured_exits_2_naming_the_key(runtime_server: RunningServer, demo_model_dir: Path,
                                                      tmp_path: Path) -> None:  # fmt: skip
    config = _files(tmp_path, runtime_server, demo_model_dir, {})
    proc = hybridctl("verify", "upstream", "--config", str(config))
    assert proc.returncode == 2 and "base_url" in proc.stderr and "settings.json" in proc.stderr


def test_agreeing_prefix() -> None:
    assert agreeing_prefix("a b c d", "a b c d") == 1.0
    assert agreeing_prefix("a b x d", "a b c d") == 0.5
    assert agreeing_prefix("", "") == 1.0 and agreeing_prefix("a", "") == 0.0
