"""The engine thread's stats snapshot (what /metrics, /server_info and /health read): rebuilt when the set of
requests changes, not after every decode step, and still exact whenever a reader can look for a request's start
or end."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from runtime.core.config import EngineArgs
from runtime.core.requests import EngineStats, GenerateRequest, RequestOutput, SamplingParams
from runtime.engine import engine_thread
from runtime.engine.engine_thread import ThreadedEngineClient, start_engine

N_NEW = 120


@pytest.fixture
def client(demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    # No time-based refresh during the test: what is left is exactly the event-driven one.
    monkeypatch.setattr(engine_thread, "_STATS_REFRESH_S", 3600.0)
    c = start_engine(EngineArgs(model_path=str(demo_model_dir), memory_budget_gib=0.5))
    yield c
    c.shutdown()


def test_stats_are_rebuilt_per_request_event_not_per_token(client: ThreadedEngineClient) -> None:
    core = client.core
    built = 0
    real = core.stats

    def counting() -> EngineStats:
        nonlocal built
        built += 1
        return real()

    core.stats = counting  # type: ignore[method-assign]  # counts the engine thread's snapshot builds
    second_token = threading.Event()
    finished = threading.Event()
    seen_running: list[int] = []

    def on_output(out: RequestOutput) -> None:  # engine thread
        if out.completion_tokens >= 2:  # the step after the prefill: the prefill's refresh is done
            second_token.set()
        if out.finished:
            finished.set()

    params = SamplingParams(temperature=0, max_new_tokens=N_NEW, ignore_eos=True)
    client.add_request(GenerateRequest("s0", list(range(10, 50)), params), on_output)
    assert second_token.wait(timeout=120)
    # Mid-stream, no refresh is due by time: the snapshot still shows the request as running (its start
    # changed the request set).
    seen_running.append(client.stats().num_running_reqs)
    assert finished.wait(timeout=120)
    _between_steps(client)  # the output is handed out inside the step; the refresh follows the step
    after = client.stats()
    assert seen_running == [1]
    assert after.num_running_reqs == 0 and after.num_requests_finished >= 1
    assert after.generation_tokens_total >= N_NEW
    assert after.kv_pages_in_use == 0 and after.state_slots_in_use == 0
    # A handful of request events (queued, admitted, finished, idle), not one build per decoded token.
    assert built < 10, f"{built} snapshot builds for {N_NEW} tokens"


def _between_steps(client: ThreadedEngineClient) -> None:
    """Returns once the engine thread has finished the loop iteration it was in (refresh included): commands
    are applied only at the top of an iteration."""
    client.call_in_engine(lambda core: None)


def test_a_command_refreshes_the_idle_snapshot(client: ThreadedEngineClient) -> None:
    done = threading.Event()
    params = SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True)
    client.add_request(GenerateRequest("f0", list(range(10, 60)), params), lambda o: o.finished and done.set())
    assert done.wait(timeout=120)
    _between_steps(client)
    assert client.stats().kv_pages_cached > 0  # the finished prompt's pages went to the prefix cache
    assert client.flush_cache()
    _between_steps(client)
    assert client.stats().kv_pages_cached == 0  # seen at once, though the engine is idle and no step follows
