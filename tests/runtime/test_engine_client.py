"""The threaded EngineClient (what the server uses) and the start-up log lines, on a real tiny model."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest, RequestOutput, SamplingError, SamplingParams
from runtime.engine.api import EngineClient
from runtime.engine.engine_thread import ThreadedEngineClient, start_engine
from runtime.engine.pool_setup import EngineStartupError
from tests.runtime.test_engine_support import build_tiny_qwen3_next, greedy, one_torch_thread


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with one_torch_thread():
        yield build_tiny_qwen3_next(Path(tmp_path_factory.mktemp("client")) / "model")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


class Waiter:
    def __init__(self) -> None:
        self.outputs: list[RequestOutput] = []
        self.done = threading.Event()
        self.thread_names: set[str] = set()

    def __call__(self, o: RequestOutput) -> None:
        self.thread_names.add(threading.current_thread().name)
        self.outputs.append(o)
        if o.finished:
            self.done.set()

    def tokens(self) -> list[int]:
        return [t for o in self.outputs for t in o.new_token_ids]


def _start(model_dir: Path, **kw: object) -> EngineClient:
    args = EngineArgs(model_path=str(model_dir), memory_budget_gib=0.05, max_total_tokens=4096, **kw)  # type: ignore[arg-type]
    return start_engine(args)


def test_startup_logs_describe_what_was_allocated(model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="runtime")
    client = _start(model_dir, max_mamba_cache_size=40, mamba_track_interval=32)
    try:
        s = client.stats()
        text = caplog.text
        m = re.search(
            r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+), conv_state size: ([\d.]+)GB, "
            r"ssm_state size: ([\d.]+)GB",
            text,
        )
        assert m and int(m.group(1)) == s.max_mamba_cache_size == 40
        assert float(m.group(2)) == round(s.conv_state_bytes / (1 << 30), 2)
        m = re.search(r"KV Cache is allocated\. dtype: torch\.float32, #tokens: (\d+), K size: ([\d.]+) GB", text)
        assert m and int(m.group(1)) == s.max_total_num_tokens == 4096
        m = re.search(
            r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), max_prefill_tokens=(\d+), "
            r"max_running_requests=(\d+), context_len=(\d+)",
            text,
        )
        assert m and int(m.group(1)) == 4096 and int(m.group(4)) == s.max_running_requests == 10
        assert "Tree cache initialized" in text and "impl=StateAwareRadixCache" in text
        assert "hybrid_ssm=True" in text and "mamba_track_interval=32" in text
        assert s.state_slots_total == 40 and s.kv_pages_total == 4096
        assert client.resolved_args()["mamba_radix_cache_strategy"] == "extra_buffer"
    finally:
        client.shutdown()


def test_state_stats_are_logged_when_asked(model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="runtime")
    client = _start(model_dir, log_mamba_state_stats=True)
    try:
        w = Waiter()
        # 40 busy steps in well under the 10 s interval: the first logs, the others must not.
        client.add_request(GenerateRequest("a", [1, 2, 3], greedy(40)), w)
        assert w.done.wait(60)
    finally:
        client.shutdown()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Mamba state stats:")]
    assert lines, "no state-stats line"
    assert "mamba_usage=" in lines[0] and "cache_hit_rate=" in lines[0] and "state_evictions=" in lines[0]
    # Throttled to one line per 10 s: a request of 40 steps (under a second here) logs once, not per step.
    assert len(lines) == 1, f"{len(lines)} state-stats lines for one short request (one per step?)"


def test_tree_cache_line_says_when_the_radix_cache_is_off(model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="runtime")
    client = _start(model_dir, disable_radix_cache=True)
    try:
        assert "impl=ChunkCache" in caplog.text and "mamba_radix_cache_strategy=none" in caplog.text
        assert client.stats().radix_cache_enabled is False
    finally:
        client.shutdown()


def test_concurrent_requests_abort_flush_and_shutdown(model_dir: Path) -> None:
    client = _start(model_dir, mamba_track_interval=8)
    try:
        waiters = {f"r{i}": Waiter() for i in range(4)}
        long = Waiter()

        def submit(rid: str) -> None:
            client.add_request(
                GenerateRequest(rid, [i % 200 for i in range(30)] + [int(rid[1:])], greedy(6)), waiters[rid]
            )

        threads = [threading.Thread(target=submit, args=(rid,)) for rid in waiters]
        for t in threads:
            t.start()
        client.add_request(GenerateRequest("long", [1] * 20, greedy(4000)), long)
        for t in threads:
            t.join()
        for w in waiters.values():
            assert w.done.wait(60)
            assert w.outputs[-1].finish_reason == {"type": "length", "length": 6}
            assert w.thread_names == {"runtime-engine"}
        again = Waiter()  # the same document again, now that the first four have checkpointed it
        client.add_request(GenerateRequest("again", [i % 200 for i in range(30)] + [9], greedy(2)), again)
        # Interval 8 puts a checkpoint at 24 <= 30. Whether the four also left a branch point at 30 (their shared
        # document) depends on whether they were admitted in one wave or one after another: both are right.
        assert again.done.wait(60) and again.outputs[-1].cached_tokens in (24, 30)
        assert not client.flush_cache()  # "long" is still running
        client.abort("long")
        assert long.done.wait(60) and long.outputs[-1].finish_reason["type"] == "abort"
        client.abort("no-such-request")
        assert client.flush_cache()
        s = client.stats()
        assert s.kv_pages_free == s.kv_pages_total and s.state_slots_free == s.state_slots_total
        assert s.num_requests_finished == 5 and s.num_requests_aborted == 1 and s.cached_tokens_total >= 24
    finally:
        client.shutdown()
    with pytest.raises(RuntimeError):
        client.add_request(GenerateRequest("late", [1], greedy(1)), Waiter())


def test_startup_errors_name_the_key(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(EngineStartupError, match="mamba_track_interval"):
        _start(model_dir, page_size=4, mamba_track_interval=6)
    with pytest.raises(EngineStartupError, match="memory-budget-gib"):
        start_engine(EngineArgs(model_path=str(model_dir), memory_budget_gib=0.0001))
    with pytest.raises(EngineStartupError, match="config.json"):
        start_engine(EngineArgs(model_path=str(tmp_path)))


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(model_dir: Path) -> None:
    client = _start(model_dir)
    assert isinstance(client, ThreadedEngineClient)
    runner = client.core.runner
    real = runner.run
    try:

        def broken(batch):  # type: ignore[no-untyped-def]  # fault injection: the model raises mid-step
            raise RuntimeError("boom")

        runner.run = broken  # type: ignore[method-assign]
        w = Waiter()
        client.add_request(GenerateRequest("a", [1, 2, 3], greedy(2)), w)
        assert w.done.wait(60)
        reason = w.outputs[-1].finish_reason
        assert reason == {
            "type": "abort",
            "message": "Internal engine error: RuntimeError: boom",
            "status_code": 500,
            "err_type": "InternalServerError",
        }
        runner.run = real  # type: ignore[method-assign]
        ok = Waiter()
        client.add_request(GenerateRequest("b", [1, 2, 3], greedy(2)), ok)
        assert ok.done.wait(60) and ok.outputs[-1].finish_reason == {"type": "length", "length": 2}
        assert client.call_in_engine(lambda core: core.check_invariants()) is None
    finally:
        client.shutdown()


def test_the_engine_is_built_on_its_own_thread_with_the_callers_thread_count(model_dir: Path) -> None:
    """The model is loaded (and any compile warm-up run) on the engine thread, so only that thread ever holds an
    OpenMP worker pool; the caller's torch thread count (--num-threads) carries over to it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        client = _start(model_dir)
    finally:
        torch.set_num_threads(before)
    try:
        assert isinstance(client, ThreadedEngineClient)
        seen = client.call_in_engine(lambda core: (threading.current_thread().name, torch.get_num_threads()))
        assert seen == ("runtime-engine", 1)
        assert client._thread is not threading.current_thread() and client._thread.name == "runtime-engine"
    finally:
        client.shutdown()
    assert not client._thread.is_alive()


def test_a_request_failing_in_sampling_or_admission_fails_alone(model_dir: Path) -> None:
    """One request's bad numbers never reach the others nor kill the loop (each case killed it, or cut a
    greedy neighbour, before the engine isolated them)."""
    client = _start(model_dir)
    try:
        solo = Waiter()
        client.add_request(GenerateRequest("solo", [5, 6, 7], greedy(12)), solo)
        assert solo.done.wait(60)
        # A direct engine client (no HTTP parser in front) cannot build values the sampler cannot use.
        with pytest.raises(SamplingError, match="seed"):
            SamplingParams(temperature=0.5, seed=2**64)
        with pytest.raises(SamplingError, match="temperature"):
            SamplingParams(temperature=float("nan"), max_new_tokens=4)
        # Nor a prompt the engine cannot hold: refused alone, with a 400.
        w = Waiter()
        client.add_request(GenerateRequest("refused", [], greedy(4)), w)
        assert w.done.wait(60), "a refused request never finished (engine loop dead?)"
        reason = w.outputs[-1].finish_reason or {}
        assert reason.get("type") == "abort" and reason.get("status_code") == 400, reason
        # A request whose sampling starts failing mid-run, in the same decode batch as a greedy neighbour.
        neighbour, bad = Waiter(), Waiter()
        bad_params = SamplingParams(temperature=0.7, max_new_tokens=12)

        def poison(out: RequestOutput) -> None:
            bad(out)
            bad_params.temperature = float("nan")  # from its next step on, sampling this row raises

        client.add_request(GenerateRequest("neighbour", [5, 6, 7], greedy(12)), neighbour)
        client.add_request(GenerateRequest("bad", [9, 9, 9], bad_params), poison)
        assert neighbour.done.wait(60) and bad.done.wait(60)
        assert neighbour.tokens() == solo.tokens()
        assert (neighbour.outputs[-1].finish_reason or {}).get("type") == "length"
        reason = bad.outputs[-1].finish_reason or {}
        assert reason.get("type") == "abort" and "sampling" in str(reason.get("message")), reason
        assert client.failure() is None
        again = Waiter()
        client.add_request(GenerateRequest("again", [5, 6, 7], greedy(12)), again)
        assert again.done.wait(60) and again.tokens() == solo.tokens()
        assert isinstance(client, ThreadedEngineClient)
        stats = client.call_in_engine(lambda core: core.stats())  # between steps: exact, not the last snapshot
        assert stats.num_running_reqs == 0 and stats.state_slots_in_use == 0 and stats.kv_pages_in_use == 0
    finally:
        client.shutdown()
