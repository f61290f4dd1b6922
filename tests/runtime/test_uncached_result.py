"""GenerateRequest.cache_result=False (the server's health probe): the finished sequence stays out of the prefix
cache, its state slot goes back on top of the free list, and the tokens are the same as a cached run's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.core.requests import GenerateRequest
from tests.runtime.test_engine_support import (
    build_tiny_qwen3_next,
    greedy,
    make_core,
    one_torch_thread,
    run_to_completion,
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3_next(Path(tmp_path_factory.mktemp("uncached")) / "model")


PROMPT = [5, 17, 99, 3, 42, 8, 61, 200]


@pytest.mark.parametrize("cache_result", [True, False])
def test_cache_result_decides_whether_the_sequence_is_cached(model_dir: Path, cache_result: bool) -> None:
    core = make_core(model_dir)
    pool = core.cache.state_pool
    first = GenerateRequest("a", PROMPT, greedy(4), cache_result=cache_result)
    got = run_to_completion(core, [first], together=False)
    _, free, cached, in_use = core.cache.slot_counts()
    assert in_use == 0
    assert (cached > 0) == cache_result
    assert (core.cache.page_counts()[2] > 0) == cache_result
    # The same prompt again: the first run's caching (or not) does not change the tokens.
    again = run_to_completion(core, [GenerateRequest("b", PROMPT, greedy(4))], together=False)
    assert again.tokens("b") == got.tokens("a")
    if not cache_result:
        assert free + cached == pool.num_slots


def test_an_uncached_request_gives_its_slot_back_for_the_next_one(model_dir: Path) -> None:
    core = make_core(model_dir)
    pool = core.cache.state_pool
    run_to_completion(core, [GenerateRequest("probe", [0], greedy(1), cache_result=False)], together=False)
    reused = pool.alloc()
    assert reused is not None and reused in pool._written  # the probe's slot, already faulted in
    pool.free(reused)
