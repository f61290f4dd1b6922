"""The server's threads on Linux: the event loop runs SCHED_BATCH (woken once per engine step, it must not
preempt the engine thread on its own core), the engine thread keeps the normal policy."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest

from tests.runtime.conftest import RunningServer

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread policies: Linux only")


def _cpu_ns(pid: int, tid: str) -> int:
    return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])


def test_event_loop_is_sched_batch_and_the_engine_thread_is_not(runtime_server: RunningServer) -> None:
    pid = runtime_server.process.pid
    body = {"text": "The capital city of France is", "sampling_params": {"max_new_tokens": 32, "ignore_eos": True}}
    res = httpx.post(runtime_server.url + "/generate", json=body, timeout=120)
    assert res.status_code == 200, res.text
    assert os.sched_getscheduler(pid) == os.SCHED_BATCH  # the main thread: uvicorn's event loop
    others = [t.name for t in Path(f"/proc/{pid}/task").iterdir() if t.name != str(pid)]
    engine = max(others, key=lambda tid: _cpu_ns(pid, tid))  # the thread that ran the forwards
    assert os.sched_getscheduler(int(engine)) == os.SCHED_OTHER
