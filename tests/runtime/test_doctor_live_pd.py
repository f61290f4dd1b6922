"""PD_STATE_MISMATCH for real: a prefill server and a decode server started from two configs whose
mamba.state_dtype differ (float32 there, bfloat16 here). `doctor --peer` predicts it from the two configs, the
real PD transfer fails on the decode server with "PD transfer mamba state size mismatch", the doctor finds that
line in the decode server's log, and after `doctor --peer --fix` the decode server takes the prefill server's
state and requests through the PD router are answered."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from hybridctl.config.loader import load_hybrid_config
from hybridctl.doctor.run import DoctorOptions, run_doctor, unprobed_host
from hybridctl.launch.pd import BUILTIN_ROUTER_MODULE, builtin_pd_plan
from runtime.pd.protocol import MISMATCH
from tests.runtime.conftest import REPO_ROOT, RunningServer, free_port, start_runtime_server

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time, in a land far away, there lived a"


def write_side(directory: Path, model_dir: Path, bootstrap: int, settings: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.toml").write_text(
        f'[server]\nmodel_path = "{model_dir}"\nengine = "builtin"\n[memory]\nmemory_budget_gib = 0.5\n'
        f"[pd]\nenable_pd_disaggregation = true\nbootstrap_port = {bootstrap}\n",
        encoding="utf-8",
    )
    (directory / "settings.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    return directory / "config.toml"


def role_flags(config: Path, role: str) -> list[str]:
    """The flags `hybridctl launch` gives this role's runtime, minus what start_runtime_server sets itself."""
    plan = builtin_pd_plan(load_hybrid_config(config, config.parent / "settings.json"))
    argv = (plan.prefill if role == "prefill" else plan.decode).argv[3:]  # after "python -m runtime"
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--model-path", "--host", "--port"):
            skip = True
        else:
            out.append(arg)
    return out


def doctor(config: Path, peer: Path, log: Path | None = None):
    lines = open(log, encoding="utf-8") if log else None
    try:
        opts = DoctorOptions(config, config.parent / "settings.json", True, log_lines=lines, log_name=str(log),
                             peer_config=peer)  # fmt: skip
        return run_doctor(opts, unprobed_host())
    finally:
        if lines:
            lines.close()


@contextmanager
def router(prefill: RunningServer, bootstrap: int, decode: RunningServer, log: Path) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", BUILTIN_ROUTER_MODULE, "--prefill", prefill.url, str(bootstrap),
           "--decode", decode.url, "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                if httpx.get(url + "/health", timeout=30).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def generate(url: str) -> httpx.Response:
    body = {"text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 6}}
    return httpx.post(url + "/generate", json=body, timeout=120)


def test_pd_dtype_mismatch_predicted_seen_and_fixed(demo_model_dir: Path, tmp_path: Path) -> None:
    bootstrap = free_port()
    peer = write_side(tmp_path / "prefill", demo_model_dir, bootstrap, {})
    config = write_side(tmp_path / "decode", demo_model_dir, bootstrap, {"mamba": {"state_dtype": "bfloat16"}})

    predicted = [f for f in doctor(config, peer).findings if f.code == "PD_STATE_MISMATCH"]
    assert [(f.severity, f.source) for f in predicted] == [("error", "peer")]
    assert [(c.file, c.key, c.value) for c in predicted[0].changes] == [
        ("settings.json", "mamba.state_dtype", "float32")
    ]

    logs = tmp_path / "logs"
    with start_runtime_server(demo_model_dir, *role_flags(peer, "prefill"), log_dir=logs) as prefill:
        with start_runtime_server(demo_model_dir, *role_flags(config, "decode"), log_dir=logs / "bad") as decode:
            with router(prefill, bootstrap, decode, logs / "router-bad.log") as url:
                res = generate(url)
            assert res.status_code != 200 and MISMATCH in res.text, res.text
            log = decode.log_path

        seen = [f for f in doctor(config, peer, log).findings if f.source == "log"]
        assert [(f.code, f.severity) for f in seen] == [("PD_STATE_MISMATCH", "error")]
        assert seen[0].line is not None and MISMATCH in (seen[0].evidence or "")
        assert seen[0].changes == predicted[0].changes  # the log and the peer config lead to the same edit

        res = subprocess.run(
            [sys.executable, "-m", "hybridctl", "doctor", "--no-host", "--config", str(config), "--peer", str(peer),
             "--fix", "--yes"],
            capture_output=True, text=True, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, timeout=120,
        )  # fmt: skip
        assert res.returncode == 2 and '"state_dtype": "float32"' in res.stdout, res.stdout + res.stderr
        assert [f for f in doctor(config, peer).findings if f.code == "PD_STATE_MISMATCH"] == []
        with start_runtime_server(demo_model_dir, *role_flags(config, "decode"), log_dir=logs / "ok") as decode:
            with router(prefill, bootstrap, decode, logs / "router-ok.log") as url:
                routed = generate(url)
            assert routed.status_code == 200, routed.text
            # The reference: the decode server computing the whole request itself, no transfer.
            alone = generate(decode.url)
            assert routed.json()["output_ids"] == alone.json()["output_ids"]
            assert len(alone.json()["output_ids"]) == 6
        assert [f for f in doctor(config, peer, decode.log_path).findings if f.source == "log"] == []
