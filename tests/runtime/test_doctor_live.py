"""The doctor against the real bundled runtime: predict a failure from the config, watch the runtime fail that
way, recognise it in the runtime's own log, `--fix` the config, and see the runtime start and serve."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from hybridctl.config.loader import load_hybrid_config
from hybridctl.doctor.run import DoctorOptions, run_doctor, unprobed_host
from hybridctl.launch.builtin_flags import builtin_command
from tests.runtime.conftest import REPO_ROOT, start_runtime_server

pytestmark = pytest.mark.slow

# A ~500-token prefix shared across questions (longer than the 256-token checkpoint interval of the config
# defaults): the second request can only hit the prefix cache if the cached
# recurrent state is handed over (snapshot on match).
DOCUMENT = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(40))


def write_project(directory: Path, model_dir: Path, memory: str = "", settings: dict | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.toml").write_text(
        f'# live doctor test\n[server]\nmodel_path = "{model_dir}"\nengine = "builtin"\n\n'
        f"[memory]\nmemory_budget_gib = 1.0  # small: CI machines are shared\n{memory}",
        encoding="utf-8",
    )
    (directory / "settings.json").write_text(json.dumps(settings or {}, indent=2) + "\n", encoding="utf-8")
    return directory / "config.toml"


def runtime_flags(config: Path) -> list[str]:
    """The launch command hybridctl builds for this config, minus what start_runtime_server sets itself."""
    cfg = load_hybrid_config(config, config.parent / "settings.json")
    argv = builtin_command(cfg).argv[3:]  # after "python -m runtime"
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--model-path", "--host", "--port"):
            skip = True
        else:
            out.append(arg)
    return out


def doctor(config: Path, log: Path | None = None):
    lines = open(log, encoding="utf-8") if log else None
    try:
        opts = DoctorOptions(
            config, config.parent / "settings.json", True, log_lines=lines, log_name=str(log)
        )
        return run_doctor(opts, unprobed_host())
    finally:
        if lines:
            lines.close()


def fix(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hybridctl", "doctor", "--no-host", "--config", str(config), "--fix", "--yes"],
        capture_output=True, text=True, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, timeout=120,
    )  # fmt: skip


def generate(url: str, question: str) -> dict:
    payload = {
        "text": f"{DOCUMENT} Question: {question}",
        "sampling_params": {"temperature": 0, "max_new_tokens": 4},
    }
    res = httpx.post(url + "/generate", json=payload, timeout=120)
    assert res.status_code == 200, res.text
    return res.json()


def test_state_pool_too_small(demo_model_dir: Path, tmp_path: Path) -> None:
    config = write_project(tmp_path, demo_model_dir, "max_mamba_cache_size = 1  # cannot hold one request\n")

    predicted = [f for f in doctor(config).findings if f.code == "MAMBA_POOL_ALLOC"]
    assert [(f.severity, f.source) for f in predicted] == [("error", "config")]

    log = tmp_path / "failed.log"
    cmd = [sys.executable, "-m", "runtime", "--model-path", str(demo_model_dir), *runtime_flags(config)]
    with open(log, "w", encoding="utf-8") as fh:
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO_ROOT, timeout=300).returncode
    assert rc == 2, log.read_text()

    seen = [f for f in doctor(config, log).findings if f.source == "log"]
    assert [(f.code, f.severity) for f in seen] == [("MAMBA_POOL_ALLOC", "error")]
    assert "too small to serve any request" in (seen[0].evidence or "")
    assert seen[0].changes == predicted[0].changes  # the log and the config lead to the same planner fix

    res = fix(config)
    assert res.returncode == 2 and "+max_mamba_cache_size = " in res.stdout, res.stdout + res.stderr
    assert "# cannot hold one request" in config.read_text(encoding="utf-8")
    assert [f for f in doctor(config).findings if f.code == "MAMBA_POOL_ALLOC"] == []
    with start_runtime_server(demo_model_dir, *runtime_flags(config), log_dir=tmp_path) as server:
        out = generate(server.url, "who jumps?")
        assert out["meta_info"]["completion_tokens"] == 4


def test_prefix_cache_miss_without_state_snapshot(demo_model_dir: Path, tmp_path: Path) -> None:
    config = write_project(tmp_path, demo_model_dir, settings={"mamba": {"state_snapshot_on_match": False}})

    predicted = [f for f in doctor(config).findings if f.code == "PREFIX_CACHE_MISS"]
    assert [(f.severity, f.source) for f in predicted] == [("warning", "config")]

    with start_runtime_server(demo_model_dir, *runtime_flags(config), log_dir=tmp_path / "off") as server:
        generate(server.url, "who jumps?")
        assert generate(server.url, "over what?")["meta_info"]["cached_tokens"] == 0
        log = server.log_path
    seen = [f for f in doctor(config, log).findings if f.source == "log"]
    assert [(f.code, f.severity) for f in seen] == [("PREFIX_CACHE_MISS", "warning")]
    assert "state_snapshot_on_match=False" in (seen[0].evidence or "")

    res = fix(config)
    assert '+    "state_snapshot_on_match": true' in res.stdout, res.stdout + res.stderr
    assert [f for f in doctor(config).findings if f.code == "PREFIX_CACHE_MISS"] == []
    with start_runtime_server(demo_model_dir, *runtime_flags(config), log_dir=tmp_path / "on") as server:
        generate(server.url, "who jumps?")
        assert generate(server.url, "over what?")["meta_info"]["cached_tokens"] > 0
    seen_after = [f for f in doctor(config, server.log_path).findings if f.source == "log"]
    assert seen_after == []
