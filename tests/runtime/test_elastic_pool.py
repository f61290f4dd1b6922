"""The elastic memory pool in-process: chunks move between KV and state as the workload shifts, never while
in use; outputs stay token-identical to fixed pools; a move that cannot happen times out, serving goes on."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.core.requests import GenerateRequest
from runtime.engine.engine_core import EngineCore
from runtime.kvcache.elastic_pool import TIMEOUT_MESSAGE
from tests.runtime.test_engine_support import build_tiny_qwen3_next, greedy, make_core, one_torch_thread


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3_next(Path(tmp_path_factory.mktemp("elastic")) / "model")


def run(core: EngineCore, reqs: list[GenerateRequest], outs: dict[str, list[int]]) -> int:
    """Queue `reqs`, step to the end checking the elastic invariants; returns the peak of running requests."""
    for r in reqs:
        core.scheduler.add_request(r, lambda o: outs.setdefault(o.rid, []).extend(o.new_token_ids))
    peak = 0
    while core.scheduler.has_work:
        core.step()
        assert core.elastic is not None
        core.check_invariants()  # the engine's check: the radix tree's and the elastic pool's
        peak = max(peak, len(core.scheduler.running))
    return peak


@pytest.mark.parametrize("page_size", [1, 4])
def test_pages_move_with_the_workload_and_outputs_match_fixed_pools(model_dir: Path, page_size: int) -> None:
    rng = random.Random(0)
    long = [GenerateRequest(f"L{i}", [rng.randrange(255) for _ in range(280)], greedy(8)) for i in range(3)]
    short = [GenerateRequest(f"S{i}", [rng.randrange(255) for _ in range(10)], greedy(8)) for i in range(24)]
    core = make_core(model_dir, enable_elastic_memory_pool=True, max_total_tokens=1024,
                     max_mamba_cache_size=8, chunked_prefill_size=256, page_size=page_size)  # fmt: skip
    elastic = core.elastic
    assert elastic is not None and elastic.mode == "cpu-repartition"
    start_cap = core.scheduler.config.max_running_requests  # 8 slots at 4 per request: 2 at once
    outs: dict[str, list[int]] = {}
    # Three 280-token prompts at once: the running cap grows with state chunks the KV side can spare.
    assert run(core, long, outs) == 3 > start_cap
    # Many short requests: the state side grows further, from KV chunks no request is using.
    peak = run(core, short, outs)
    assert elastic.counters.moves_to_state > 0 and peak > 3
    # Long prompts again: free state chunks go back to the KV side.
    again = [GenerateRequest(f"A{i}", r.input_ids + [1] * 400, greedy(8)) for i, r in enumerate(long[:2])]
    run(core, again, outs)
    assert elastic.counters.moves_to_kv > 0
    stats = core.stats()
    assert stats.elastic_moves_total == elastic.counters.moves and stats.elastic_mode == "cpu-repartition"
    assert stats.max_mamba_cache_size == core.cache.state_pool.num_slots
    assert len(elastic.counters.history) >= 3
    # The same requests on fixed pools, one at a time and without the cache: the same tokens.
    ref = make_core(model_dir, disable_radix_cache=True, chunked_prefill_size=-1)
    ref_outs: dict[str, list[int]] = {}
    for r in [*long, *short, *again]:
        ref.scheduler.add_request(r, lambda o: ref_outs.setdefault(o.rid, []).extend(o.new_token_ids))
        while ref.scheduler.has_work:
            ref.step()
    assert outs == ref_outs


def test_a_move_blocked_by_running_requests_times_out_and_serving_goes_on(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    core = make_core(model_dir, enable_elastic_memory_pool=True, max_total_tokens=1024,
                     max_mamba_cache_size=4, elastic_realloc_timeout_s=0.05)  # fmt: skip
    assert core.elastic is not None
    # Four slots run one request (four slots per request); it promises nearly every KV page, so the second
    # request waits for state slots that no KV chunk can become while those pages are promised.
    reqs = [GenerateRequest(f"R{i}", [i + 1] * 10, greedy(1000)) for i in range(2)]
    outs: dict[str, list[int]] = {}
    with caplog.at_level(logging.ERROR, logger="runtime.kvcache"):
        run(core, reqs, outs)
    assert core.elastic.counters.timeouts >= 1
    line = next(r.getMessage() for r in caplog.records if TIMEOUT_MESSAGE in r.getMessage())
    assert "pages pinned by running requests" in line and "elastic_realloc_timeout_s=0.05s" in line
    assert all(len(outs[r.rid]) == 1000 for r in reqs)  # the waiting request ran once a slot came free
    assert core.stats().elastic_realloc_timeouts_total == core.elastic.counters.timeouts


def test_elastic_with_speculative_decoding_refuses_to_start(model_dir: Path) -> None:
    from runtime.engine.pool_setup import EngineStartupError

    with pytest.raises(EngineStartupError, match="elastic_memory_pool with speculative decoding"):
        make_core(model_dir, enable_elastic_memory_pool=True, speculative_algorithm="NGRAM")


def test_start_up_is_linear_in_the_pool_size() -> None:
    """The default 4 GiB budget's shape (about a million KV rows, thousands of state chunks) attaches at once.

    Handing the top chunks to the state pool used to rebuild the KV free list per chunk: quadratic, and at
    this size it had not finished after minutes. A deadline of 60 s leaves a wide margin over the linear pass
    (well under a second) while the quadratic one needs hours.
    """
    import threading

    import torch

    from runtime.kvcache.cache_manager import CacheManager
    from runtime.kvcache.elastic_buffer import ElasticGeometry
    from runtime.kvcache.elastic_pool import ElasticPool
    from runtime.kvcache.page_pool import KVPagePool
    from runtime.kvcache.state_pool import StateSlotPool

    geo = ElasticGeometry(row_bytes=64, slot_bytes=8192, rows_per_chunk=128, page_size=1, num_chunks=8000)
    cache = CacheManager(KVPagePool(1, 1), StateSlotPool(1, None), radix_enabled=True, dual_lru=True,
                         snapshot_on_match=True, copy_on_write=True)  # fmt: skip
    pool = ElasticPool(geo, torch.empty(0, dtype=torch.uint8), timeout_s=5.0, mode="cpu-repartition")
    state_chunks = 7000
    worker = threading.Thread(target=pool.attach, args=(cache, state_chunks), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the elastic pool's start-up did not finish in 60 s (quadratic hand-over?)"
    ppc = geo.pages_per_chunk
    assert cache.kv_pool.num_pages == cache.kv_pool.num_free == (geo.num_chunks - state_chunks) * ppc
    assert sorted(cache.kv_pool.free_pages()) == list(range((geo.num_chunks - state_chunks) * ppc))
    assert sorted(cache.state_pool.free_slots()) == list(range(geo.num_chunks - state_chunks, geo.num_chunks))
    assert cache.state_pool.num_slots == state_chunks and pool.counters.moves == 0
    # A run-time move still works on the attached pools: a free state chunk goes back to KV, and returns.
    assert pool.grow_kv() is None and cache.kv_pool.num_pages == (geo.num_chunks - state_chunks + 1) * ppc
    assert pool.grow_state() is None and cache.state_pool.num_slots == state_chunks
