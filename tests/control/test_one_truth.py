"""Small one-source-of-truth facts, each through the real CLI or loader: the same numbers from init, plan and doctor,
the article's files, located duplicate keys, keys in URLs, plan's JSON when nothing fits, the demo run twice."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridctl.cli import app
from hybridctl.config.secret_scan import classify_secret
from hybridctl.rules.check import check_files

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
ARTICLE = Path(__file__).parent / "data" / "article-files"
QWEN3_NEXT = REPO / "templates" / "models" / "qwen3-next-80b-a3b.json"


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout, whatever directory the command runs in
    return subprocess.run(
        [sys.executable, "-m", "hybridctl", *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env
    )


# --- the article's files -----------------------------------------------------------------------------------


def test_article_files_against_sglang_say_what_is_ignored_and_renamed() -> None:
    result = runner.invoke(
        app, ["validate", str(ARTICLE / "config.toml"), "--engine", "sglang", "--engine-version", "0.5.23", "--json"]
    )
    assert result.exit_code == 0, result.output
    findings = json.loads(result.output)["findings"]
    by_key = {(f["code"], f["key"]): f for f in findings}
    ignored = by_key[("IGNORED_BY_ENGINE", "logging.log_mamba_state_stats")]
    assert ignored["line"] == 16 and "SGLang 0.5.23 has no equivalent" in ignored["message"]
    assert "--enable-unified-memory" in by_key[("ENGINE_NAME", "memory.enable_elastic_memory_pool")]["message"]
    assert "--speculative-eagle-topk" in by_key[("ENGINE_NAME", "speculative.speculative_topk")]["message"]
    assert ("HOST_EXPOSED", "server.host") in by_key  # 0.0.0.0 without a key
    assert ("SPEC_ROLLBACK", "speculative.speculative_num_draft_tokens") in by_key  # 8 drafts, a chain of 4


def test_article_files_against_the_bundled_runtime_fail_in_validate_as_they_would_at_start() -> None:
    result = runner.invoke(app, ["validate", str(ARTICLE / "config.toml"), "--engine", "builtin", "--json"])
    assert result.exit_code == 2
    codes = {(f["code"], f["key"]) for f in json.loads(result.output)["findings"] if f["severity"] == "error"}
    assert codes == {
        ("MODEL_PATH_NOT_FOUND", "server.model_path"),  # a hub id: the runtime loads local directories
        ("MODEL_PATH_NOT_FOUND", "server.tokenizer_path"),  # the same hub id
        ("BUILTIN_UNSUPPORTED", "memory.enable_elastic_memory_pool"),  # elastic pool + EAGLE
    }


def test_article_files_plan_and_doctor(tmp_path: Path) -> None:
    config = str(ARTICLE / "config.toml")
    plan = cli("plan", config, "--model", str(QWEN3_NEXT), "--gpu-mem-gib", "80", "--tp", "4", "--json")
    assert plan.returncode == 0, plan.stderr
    data = json.loads(plan.stdout)
    assert data["engine"] == "sglang" and data["mamba_full_memory_ratio"] == 0.35
    assert data["kv_bytes_per_token_total"] == 4 * data["kv_bytes_per_token_per_gpu"]
    # The article's hub id is read from hybridctl's bundled config.json: 80B on one 80 GiB GPU does not fit.
    hub = cli("plan", config, "--gpu-mem-gib", "80")
    assert hub.returncode == 1 and "Traceback" not in hub.stderr and "do not fit" in hub.stderr, hub.stderr
    # --gpu-mem-gib on this GPU-less host: the SGLang server being planned; as plan, its pools do not fit.
    doctor = cli("doctor", "--config", config, "--gpu-mem-gib", "80", "--json")
    assert doctor.returncode == 2 and "Traceback" not in doctor.stderr
    codes = {f["code"] for f in json.loads(doctor.stdout)["findings"]}
    assert {"HOST_EXPOSED", "IGNORED_BY_ENGINE", "SPEC_ROLLBACK", "MAMBA_POOL_ALLOC"} <= codes


# --- duplicate keys, secrets --------------------------------------------------------------------------------


def test_toml_duplicate_key_has_a_line(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('[server]\nport = 1\nhost = "127.0.0.1"\nport = 2\n')
    report = check_files(tmp_path / "config.toml", tmp_path / "settings.json")
    [dup] = report.errors
    assert (dup.code, dup.key, dup.line) == ("DUPLICATE_KEY", "server.port", 4)


def test_json_duplicate_key_keeps_its_section(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("")
    (tmp_path / "settings.json").write_text('{\n "logging": {\n  "level": "info",\n  "level": "debug"\n }\n}\n')
    report = check_files(tmp_path / "config.toml", tmp_path / "settings.json")
    [dup] = [f for f in report.findings if f.code == "DUPLICATE_KEY"]
    assert dup.key == "logging.level" and dup.line == 3 and '"logging" object' in dup.message


@pytest.mark.parametrize(
    "url",
    ["https://gw.example/v1?api_key=abc123", "https://gw.example/v1?token=t0k3n&x=1", "https://gw.example/v1?key=k"],
)
def test_keys_in_url_queries_are_literal_secrets(url: str) -> None:
    assert classify_secret("base_url", url) is not None
    assert classify_secret("base_url", "https://gw.example/v1?max_tokens=5") is None


# --- plan: JSON when nothing fits, the right pool blamed -----------------------------------------------------


def test_plan_json_when_the_pools_do_not_fit() -> None:
    result = cli("plan", "--model", str(QWEN3_NEXT), "--gpu-mem-gib", "80", "--json")
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert data["fits"] is False and "weights" in data["error"]


def test_max_total_tokens_1_blames_the_kv_pool() -> None:
    result = cli("plan", "--model", str(QWEN3_NEXT), "--gpu-mem-gib", "80", "--tp", "4", "--max-total-tokens", "1")
    assert result.returncode == 1
    assert "KV cache is too small" in result.stderr and "max_total_tokens" in result.stderr
    assert "state cache" not in result.stderr


# --- the demo: what init prints is what it writes; twice; a busy port --------------------------------------


def test_init_demo_prints_what_it_writes_twice_and_on_a_busy_port(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    with socket.socket() as busy:
        try:
            busy.bind(("127.0.0.1", 30000))
        except OSError:
            pass  # something here already holds 30000: the same situation
        busy.listen()
        first = cli("init", "--demo", "--out", str(tmp_path), "--json")
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout)
    written = json.loads((tmp_path / "settings.json").read_text())["runtime"]["max_running_requests"]
    assert result["plan"]["max_running_requests"] == written and result["plan"]["engine"] == "builtin"
    assert result["config"]["server"]["port"] != 30000
    plan = json.loads(cli("plan", "--json", cwd=tmp_path).stdout)
    assert (plan["max_running_requests"], plan["max_total_num_tokens"]) == (
        written,
        result["plan"]["max_total_num_tokens"],
    )
    again = cli("init", "--demo", "--out", str(tmp_path))
    assert again.returncode == 0 and "kept the demo" in again.stdout


def test_doctor_hint_names_no_option_it_lacks(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "config.toml").write_text('[server]\nengine = "builtin"\nmodel_path = "m"\n')
    result = cli("doctor", "--config", str(tmp_path / "config.toml"), "--no-host")
    assert "config.json" in result.stdout and "Point --model" not in result.stdout


def test_doctor_honours_gpu_mem_gib_on_a_gpu_less_host(tmp_path: Path) -> None:
    from hybridctl.host.nvml import gpu_memory_bytes

    if gpu_memory_bytes() is not None:
        pytest.skip("this host has a GPU")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(QWEN3_NEXT.read_text())
    (tmp_path / "config.toml").write_text(f'[server]\nmodel_path = "{model}"\ntp_size = 4\n')  # engine auto
    doctor = json.loads(
        cli("doctor", "--config", str(tmp_path / "config.toml"), "--gpu-mem-gib", "80", "--json").stdout
    )
    pools = next(c for c in doctor["checks"] if c["name"] == "Pools")
    assert pools["summary"].startswith("sglang:") and "an 80 GiB GPU" in " ".join(pools["details"])
    plan = json.loads(cli("plan", str(tmp_path / "config.toml"), "--gpu-mem-gib", "80", "--json").stdout)
    assert f"{plan['max_total_num_tokens']} KV tokens" in pools["summary"]
