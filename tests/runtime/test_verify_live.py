"""`hybridctl verify` against the real bundled runtime over loopback.

Cache on passes; cache off fails and says why; a config naming another model fails basic; the API key is read
from the environment; a dead port exits 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.conftest import RunningServer, free_port, start_runtime_server

SHORT = ["--doc-tokens", "512", "--trials", "3", "--warmup", "1"]
TINY = ["--doc-tokens", "256", "--trials", "2", "--warmup", "0"]  # enough to see cached_tokens stay 0


def hybridctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hybridctl", *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )  # fmt: skip


def as_json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def check(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["name"] == name)


def test_verify_all_passes_with_cache_on_and_repeated_runs_agree(runtime_server: RunningServer) -> None:
    runs = []
    for _ in range(2):
        proc = hybridctl("verify", "all", "--url", runtime_server.url, "--json", *SHORT)
        report = as_json(proc)
        assert proc.returncode == 0, json.dumps(report, indent=1)[:3000]
        runs.append(report)
    for report in runs:
        assert report["passed"] is True
        assert [c["name"] for c in report["checks"]] == ["basic", "prefix-cache", "spec"]
        assert check(report, "basic")["status"] == "passed"
        assert check(report, "spec")["status"] == "skipped"
        assert "without speculative decoding" in check(report, "spec")["reasons"][0]
        prefix = check(report, "prefix-cache")
        assert prefix["status"] == "passed"
        m = prefix["measurements"]
        assert m["document_tokens"] == 512 and m["document_tokens_exact"] is True
        for case in ("realistic", "identical"):
            assert all(row[-1] >= 0.9 * 512 for row in m[case]["cached_tokens"])
            assert m[case]["ratio"]["ratio"] <= 0.8
            spread = m[case]["per_trial_ratio"]
            assert spread["min"] <= m[case]["ratio"]["ratio"] <= spread["max"]
        assert m["cold_cached_tokens"] == [0, 0, 0]  # flushed: cold really is cold
        metrics = m["metrics"]  # the shared server runs with --enable-metrics
        assert metrics is not None and metrics["hit_rate_during_check"] > 0.3
    # Repeated runs agree: both clear the threshold, and each run's CI is reported.
    ratios = [check(r, "prefix-cache")["measurements"]["realistic"]["ratio"] for r in runs]
    assert all(r["ci_low"] <= r["ratio"] <= r["ci_high"] for r in ratios)


def test_verify_table_output_and_basic_with_config(runtime_server: RunningServer, demo_model_dir: Path,
                                                   tmp_path: Path) -> None:  # fmt: skip
    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = {runtime_server.port}\nmodel_path = "{demo_model_dir}"\n'
        'engine = "builtin"\n'
    )
    proc = hybridctl("verify", "basic", "--config", str(config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "model matches config" in proc.stdout and "PASSED" in proc.stdout

    wrong = tmp_path / "wrong.toml"
    wrong.write_text(config.read_text().replace(str(demo_model_dir), str(tmp_path / "other-model")))
    proc = hybridctl("verify", "basic", "--config", str(wrong), "--json")
    report = as_json(proc)
    assert proc.returncode == 1 and report["passed"] is False
    reasons = check(report, "basic")["reasons"]
    assert any("model_path" in r and "another model" in r for r in reasons), reasons


@pytest.mark.slow
def test_cache_off_fails_and_names_the_reason_and_api_key_comes_from_env(demo_model_dir: Path) -> None:
    with start_runtime_server(
        demo_model_dir, "--disable-radix-cache", "--api-key", "s3cret-test-key"
    ) as server:
        proc = hybridctl("verify", "basic", "--url", server.url, "--json")
        report = as_json(proc)
        assert proc.returncode == 1
        assert "--api-key-env" in check(report, "basic")["reasons"][0]

        proc = hybridctl("verify", "basic", "--url", server.url, "--api-key-env", "HYBRIDCTL_TEST_KEY_UNSET")
        assert proc.returncode == 2 and "HYBRIDCTL_TEST_KEY_UNSET" in proc.stderr

        env = {"HYBRIDCTL_TEST_KEY": "s3cret-test-key"}
        proc = hybridctl("verify", "prefix-cache", "--url", server.url, "--api-key-env", "HYBRIDCTL_TEST_KEY",
                         "--json", *TINY, env=env)  # fmt: skip
        report = as_json(proc)
        assert proc.returncode == 1 and report["passed"] is False
        assert "s3cret-test-key" not in proc.stdout + proc.stderr
        prefix = check(report, "prefix-cache")
        assert prefix["status"] == "failed"
        assert "cached_tokens was 0 on every warm request" in prefix["reasons"][0]
        assert "disable_radix_cache" in prefix["reasons"][0]
        assert "the server reports disable_radix_cache=true" in prefix["reasons"][0]

        proc = hybridctl("verify", "prefix-cache", "--url", server.url, "--api-key-env", "HYBRIDCTL_TEST_KEY",
                         *TINY, env=env)  # fmt: skip
        assert proc.returncode == 1
        assert "FAILED" in proc.stdout and "prefix cache is off or not matching" in proc.stdout


def test_dead_port_exits_2_with_a_clear_message() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    proc = hybridctl("verify", "all", "--url", url)
    assert proc.returncode == 2
    assert f"cannot reach the server at {url}" in proc.stderr and "Traceback" not in proc.stderr
    proc = hybridctl("verify", "spec", "--url", url, "--json")
    assert proc.returncode == 2
    assert as_json(proc) == {
        "passed": False,
        "url": url,
        "error": json.loads(proc.stdout)["error"],
        "checks": [],
    }


def _spec_config(path: Path, port: int, model_dir: Path) -> Path:
    path.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = {port}\nmodel_path = "{model_dir}"\nengine = "builtin"\n'
        f'[speculative]\nspeculative_algorithm = "STANDALONE"\nspeculative_num_steps = 3\n'
        f'speculative_num_draft_tokens = 4\nspeculative_draft_model_path = "{model_dir}"\n'
    )
    return path


def test_spec_configured_but_server_without_spec_fails(runtime_server: RunningServer, demo_model_dir: Path,
                                                       tmp_path: Path) -> None:  # fmt: skip
    config = _spec_config(tmp_path / "config.toml", runtime_server.port, demo_model_dir)
    proc = hybridctl("verify", "spec", "--config", str(config), "--json")
    report = as_json(proc)
    assert proc.returncode == 1 and check(report, "spec")["status"] == "failed"
    assert "runs without speculative decoding" in check(report, "spec")["reasons"][0]


@pytest.mark.slow
def test_spec_accept_length_with_the_target_as_its_own_draft(demo_model_dir: Path, tmp_path: Path) -> None:
    # A draft identical to the target proposes exactly what greedy decoding picks: every draft is accepted, so
    # the accept length sits at the ceiling steps + 1 = 4 (a little under if a request stops mid-round).
    flags = ("--enable-metrics", "--speculative-algorithm", "STANDALONE",
             "--speculative-draft-model-path", str(demo_model_dir))  # fmt: skip
    with start_runtime_server(demo_model_dir, *flags) as server:
        config = _spec_config(tmp_path / "config.toml", server.port, demo_model_dir)
        proc = hybridctl("verify", "spec", "--config", str(config), "--json", "--spec-requests", "2")
        report = as_json(proc)
        assert proc.returncode == 0, json.dumps(report, indent=1)
        m = check(report, "spec")["measurements"]
        assert m["algorithm"] == "STANDALONE" and m["ceiling"] == 4
        assert 3.0 <= m["accept_length"] <= 4.0
        assert (
            m["metrics_accept_length"] is not None
            and abs(m["metrics_accept_length"] - m["accept_length"]) < 0.4
        )
        proc = hybridctl("verify", "basic", "--config", str(config), "--json")
        assert proc.returncode == 0, proc.stdout
