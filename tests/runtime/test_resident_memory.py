"""A tiny model costs megabytes of pool memory, not its budget: the pools are cut to need and left untouched
until written (runtime/core/buffers.py, hybridshared/sizing/runtime_pools.py `cap_to_need`).

Resident memory is read from /proc (VmRSS, VmHWM) of the real server process: not a timing, so not sensitive to
a busy machine. The bound (1 GiB) is far above what the server holds (about 0.3 GB idle: torch's import is
~0.22 GB) and far below the 4 GiB default budget that used to be resident from start-up.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
import pytest

from tests.runtime.conftest import RunningServer, start_runtime_server

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/PID/status")

BOUND_MIB = 1024


def _status_mib(server: RunningServer, key: str) -> float:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"{key} missing from /proc/{server.process.pid}/status")


def _generate(server: RunningServer, n_in: int, n_out: int) -> None:
    ids = [(7 * i) % 4000 + 10 for i in range(n_in)]
    payload = {"input_ids": ids, "sampling_params": {"max_new_tokens": n_out, "temperature": 0, "ignore_eos": True}}
    res = httpx.post(f"{server.url}/generate", json=payload, timeout=300)
    assert res.status_code == 200, res.text


def test_default_flags_idle_and_peak_resident_memory(demo_model_dir: Path) -> None:
    """The default configuration (4 GiB budget): idle and after a 2048-token prompt, well under 1 GiB."""
    with start_runtime_server(demo_model_dir, "--num-threads", "1") as server:
        # The pools are sized from the budget here (no request cap given), gigabytes of them: untouched.
        sizes = re.findall(r"(?:size|K size|V size): ([0-9.]+) ?GB", server.log_text())
        assert sum(float(s) for s in sizes) * 1024 > 2 * BOUND_MIB, sizes
        idle = _status_mib(server, "VmRSS")
        assert idle < BOUND_MIB, f"idle resident memory {idle:.0f} MiB (default flags)"
        _generate(server, 2048, 16)
        peak = _status_mib(server, "VmHWM")
        assert peak < BOUND_MIB, f"peak resident memory {peak:.0f} MiB after one 2048-token prompt"


def test_llama_cpp_context_and_concurrency_pools_are_cut_to_need(demo_model_dir: Path) -> None:
    """-c 16384 -np 8 as the peer benchmark gives llama.cpp: the KV pool is 8 x 16384 tokens, not the budget's."""
    flags = ("--num-threads", "1", "--context-length", "16384", "--max-running-requests", "8")
    with start_runtime_server(demo_model_dir, *flags) as server:
        info = httpx.get(f"{server.url}/server_info", timeout=30).json()
        assert info["max_total_num_tokens"] == 8 * 16384 and info["max_running_requests"] == 8
        assert "Pools cut to need" in server.log_text()
        idle = _status_mib(server, "VmRSS")
        assert idle < BOUND_MIB, f"idle resident memory {idle:.0f} MiB"
