"""Memory pressure: the cache is evicted before anything fails, requests wait instead of dying, a request that
can never fit fails alone with a clear message, and the accounting holds after random workloads with
aborts."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.core.requests import GenerateRequest
from runtime.engine.engine_core import EngineCore
from runtime.kvcache.cache_manager import CacheManager
from runtime.kvcache.page_pool import KVPagePool
from runtime.kvcache.state_pool import StateSlotPool
from tests.runtime.test_engine_support import (
    Collected,
    build_tiny_qwen3_next,
    greedy,
    make_core,
    one_torch_thread,
    run_to_completion,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with one_torch_thread():
        yield build_tiny_qwen3_next(Path(tmp_path_factory.mktemp("pressure")) / "model")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def test_cache_is_evicted_before_requests_wait_and_nothing_fails(model_dir: Path) -> None:
    # 256 KV tokens, each request needs 60 + 8: the cache of finished ones is evicted to admit later ones.
    core = make_core(model_dir, max_total_tokens=256, max_mamba_cache_size=16, mamba_track_interval=8)
    rng = random.Random(0)
    reqs = [GenerateRequest(f"r{i}", [rng.randrange(255) for _ in range(60)], greedy(8)) for i in range(12)]
    got = run_to_completion(core, reqs, together=True)
    for r in reqs:
        assert got.final(r.rid).finish_reason == {"type": "length", "length": 8}
    stats = core.stats()
    assert stats.kv_evictions > 0 and stats.num_allocation_failures == 0
    # Everything the requests held came back; what is left is cache, all of it reclaimable.
    assert stats.kv_pages_in_use == 0 and stats.state_slots_in_use == 0
    assert stats.kv_pages_free + stats.kv_pages_cached == stats.kv_pages_total


def test_requests_wait_for_state_slots_instead_of_failing(model_dir: Path) -> None:
    core = make_core(model_dir, max_mamba_cache_size=4, max_running_requests=64)
    assert core.scheduler.config.max_running_requests == 1  # 4 slots at 4 slots per request (planner's ratio)
    core.scheduler.config.max_running_requests = 8  # let admission, not the cap, be the limit here
    reqs = [GenerateRequest(f"r{i}", [i + 1] * 20, greedy(4)) for i in range(10)]
    got = Collected()
    for r in reqs:
        core.scheduler.add_request(r, got.callback())
    max_running = 0
    while core.scheduler.has_work:
        core.step()
        core.scheduler.check_invariants()
        max_running = max(max_running, len(core.scheduler.running))
    assert max_running == 4  # one private slot each; the rest waited
    assert all(got.final(r.rid).finish_reason["type"] == "length" for r in reqs)


def test_request_that_can_never_fit_the_kv_pool_fails_alone(model_dir: Path) -> None:
    core = make_core(model_dir, max_total_tokens=128)
    small = GenerateRequest("small", [3] * 30, greedy(4))
    huge = GenerateRequest("huge", [5] * 100, greedy(64))  # 163 tokens > 128 in the whole pool
    got = run_to_completion(core, [huge, small], together=True)
    reason = got.final("huge").finish_reason
    assert reason is not None and reason["type"] == "abort"
    assert reason["message"].startswith("KV cache pool allocation failed")
    assert "128 tokens" in reason["message"] and "memory_budget_gib" in reason["message"]
    assert got.final("small").finish_reason == {"type": "length", "length": 4}
    assert core.stats().num_allocation_failures == 1


def test_request_that_can_never_fit_the_state_pool_fails_alone(model_dir: Path) -> None:
    core = make_core(model_dir)
    # A state pool without a single slot: the planner never sizes one, so build it on the real buffers.
    core.scheduler.cache = CacheManager(
        KVPagePool(512, 1),
        StateSlotPool(0, core.pools.buffers),
        radix_enabled=True,
        dual_lru=True,
        snapshot_on_match=True,
        copy_on_write=True,
    )
    got = run_to_completion(core, [GenerateRequest("a", [1, 2, 3], greedy(2))], together=True)
    reason = got.final("a").finish_reason
    assert reason is not None and reason["type"] == "abort"
    msg = reason["message"]
    assert msg.startswith("Mamba state pool allocation failed")
    assert "has 0" in msg and "max_mamba_cache_size" in msg and "mamba_full_memory_ratio" in msg
    assert "memory_budget_gib" in msg
    assert not core.scheduler.has_work


def test_abort_frees_everything(model_dir: Path) -> None:
    core = make_core(model_dir, mamba_track_interval=8)
    got = Collected()
    for i in range(3):
        core.scheduler.add_request(GenerateRequest(f"r{i}", [i + 7] * 40, greedy(50)), got.callback())
    for _ in range(8):
        core.step()
    assert core.scheduler.abort("r1") and core.scheduler.abort("r0") and core.scheduler.abort("r2")
    assert not core.scheduler.abort("r2")  # unknown now: a no-op
    core.scheduler.check_invariants()
    s = core.stats()
    assert s.kv_pages_in_use == 0 and s.state_slots_in_use == 0 and s.num_running_reqs == 0
    for rid in ("r0", "r1", "r2"):
        assert got.final(rid).finish_reason["type"] == "abort"
    assert core.scheduler.flush_cache()
    s = core.stats()
    assert s.kv_pages_free == s.kv_pages_total and s.state_slots_free == s.state_slots_total


def test_flush_is_refused_while_requests_run(model_dir: Path) -> None:
    core = make_core(model_dir)
    got = Collected()
    core.scheduler.add_request(GenerateRequest("a", [1] * 10, greedy(3)), got.callback())
    core.step()
    assert not core.scheduler.flush_cache()
    while core.scheduler.has_work:
        core.step()
    assert core.stats().kv_pages_cached > 0
    assert core.scheduler.flush_cache() and core.stats().kv_pages_cached == 0


_cores: dict[str, EngineCore] = {}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(0, 3), st.integers(1, 40), st.integers(1, 12)),
            st.tuples(st.just("step"), st.integers(1, 6)),
            st.tuples(st.just("abort"), st.integers(0, 20)),
        ),
        min_size=1,
        max_size=25,
    ),
    setting=st.sampled_from(
        [(True, True, 1), (False, True, 1), (True, False, 1), (True, True, 4), (False, False, 2)]
    ),
)
def test_accounting_invariants_after_random_workloads_with_aborts(
    model_dir: Path, ops: list[tuple], setting: tuple[bool, bool, int]
) -> None:
    dual_lru, copy_on_write, page_size = setting
    key = str(setting)
    if key not in _cores:  # a small pool, so eviction and waiting happen; one engine per setting
        _cores[key] = make_core(
            model_dir, max_total_tokens=192, max_mamba_cache_size=10, mamba_track_interval=4,
            chunked_prefill_size=16, dual_lru_eviction=dual_lru, state_copy_on_write=copy_on_write,
            page_size=page_size,
        )  # fmt: skip
    core = _cores[key]
    prefixes = [[1] * 24, [2, 3] * 10, [9] * 4, []]
    got = Collected()
    added: list[str] = []
    for op in ops:
        if op[0] == "add":
            _, which, suffix_len, max_new = op
            rid = f"q{len(added)}"
            prompt = prefixes[which] + [(len(added) * 13 + j) % 250 for j in range(suffix_len)]
            core.scheduler.add_request(GenerateRequest(rid, prompt, greedy(max_new)), got.callback())
            added.append(rid)
        elif op[0] == "step":
            for _ in range(op[1]):
                core.step()
                core.scheduler.check_invariants()
        elif added:
            core.scheduler.abort(added[op[1] % len(added)])
            core.scheduler.check_invariants()
    while core.scheduler.has_work:
        core.step()
        core.scheduler.check_invariants()
    for rid in added:  # every request got exactly one final output
        finals = [o for o in got.outputs[rid] if o.finished]
        assert len(finals) == 1
    s = core.stats()
    assert s.kv_pages_in_use == 0 and s.state_slots_in_use == 0
    assert s.kv_pages_free + s.kv_pages_cached == s.kv_pages_total
    assert s.state_slots_free + s.state_slots_cached == s.state_slots_total
