"""The elastic pool on a real server: the start-up line names the mode, /metrics shows the split and its
moves, and a reallocation blocked by running requests times out for real, which `doctor --log` recognizes."""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from runtime.kvcache.elastic_pool import TIMEOUT_MESSAGE
from tests.runtime.conftest import start_runtime_server

FLAGS = (
    "--memory-budget-gib", "0.5", "--enable-metrics", "--enable-elastic-memory-pool",
    "--elastic-realloc-timeout-s", "0.2", "--max-total-tokens", "512", "--max-mamba-cache-size", "4",
)  # fmt: skip


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def test_elastic_server_times_out_a_pinned_move_and_serves_on(demo_model_dir: Path, tmp_path: Path) -> None:
    with start_runtime_server(demo_model_dir, *FLAGS, log_dir=tmp_path) as server:
        assert "Elastic memory pool: mode=cpu-repartition" in server.log_text()
        before = httpx.get(server.url + "/metrics", timeout=30).text
        assert metric(before, "runtime:elastic_state_pool_slots") == 4
        assert metric(before, "runtime:elastic_kv_pool_tokens") >= 512
        # Four slots run one request at a time (four slots per request); a long generation promises almost
        # every KV page, so the second request waits for state slots no KV chunk can become meanwhile.
        body = {"input_ids": [5] * 12, "sampling_params": {"temperature": 0, "max_new_tokens": 450,
                                                              "ignore_eos": True}}  # fmt: skip
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda _: httpx.post(server.url + "/generate", json=body, timeout=300),
                                    range(2)))  # fmt: skip
        assert [a.status_code for a in answers] == [200, 200]  # both served, on the split it had
        after = httpx.get(server.url + "/metrics", timeout=30).text
        assert metric(after, "runtime:elastic_realloc_timeouts_total") >= 1
        log = server.log_text()
        assert TIMEOUT_MESSAGE in log and "pages pinned by running requests" in log
        log_path = server.log_path
    doctor = subprocess.run(
        [sys.executable, "-m", "hybridctl", "doctor", "--no-host", "--log", str(log_path), "--json",
         "--config", str(tmp_path / "absent.toml")],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert "ELASTIC_TIMEOUT" in doctor.stdout, doctor.stdout + doctor.stderr
