"""Greedy outputs are token-identical with the prefix cache on and off (checkpoints written during the forward
or by splitting it; extra_buffer or no_buffer), chunked prefill on and off, batched and alone: a hypothesis
property over random prompts that share prefixes, engine-level and in-process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.core.requests import GenerateRequest
from runtime.engine.engine_core import EngineCore
from tests.runtime.test_engine_support import (
    FAMILIES,
    TINY_BUILDERS,
    VOCAB,
    greedy,
    make_core,
    one_torch_thread,
    run_to_completion,
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module", params=FAMILIES)
def cores(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, EngineCore]:
    build = TINY_BUILDERS[request.param]
    model_dir = build(Path(tmp_path_factory.mktemp(request.param)) / "model")
    # The model writes checkpoints during one forward (ForwardBatch.state_checkpoints); this engine instead ends
    # each prefill forward at a checkpoint and copies the slot, the path for models without that support.
    split = make_core(model_dir, chunked_prefill_size=7, mamba_track_interval=8)
    split.scheduler.config.in_forward_checkpoints = False
    return {
        "split_checkpoints": split,
        # End-of-sequence states and branch points only.
        "no_buffer": make_core(model_dir, mamba_radix_cache_strategy="no_buffer", chunked_prefill_size=9),
        # The reference: no cache, each prompt in one forward, one request at a time.
        "reference": make_core(model_dir, disable_radix_cache=True, chunked_prefill_size=-1),
        # Cache on, checkpoints every 8 tokens written during the forward, prefill chunks of 7 (so chunk and
        # checkpoint boundaries mix).
        "cache_chunked": make_core(model_dir, chunked_prefill_size=7, mamba_track_interval=8),
        "cache_whole": make_core(model_dir, chunked_prefill_size=-1, mamba_track_interval=4),
        "nocache_chunked": make_core(model_dir, disable_radix_cache=True, chunked_prefill_size=5),
        # Pages of 4 tokens, single LRU, states handed over instead of copied.
        "paged_single_lru": make_core(
            model_dir,
            page_size=4,
            mamba_track_interval=8,
            chunked_prefill_size=12,
            dual_lru_eviction=False,
            state_copy_on_write=False,
        ),  # fmt: skip
    }


token = st.integers(0, VOCAB - 2)  # VOCAB-1 is EOS; ignore_eos is set anyway
prompts_with_shared_prefixes = st.lists(st.lists(token, min_size=1, max_size=30), min_size=1, max_size=3).flatmap(
    lambda prefixes: st.lists(
        st.tuples(st.sampled_from(prefixes), st.lists(token, min_size=1, max_size=12)).map(lambda t: t[0] + t[1]),
        min_size=2,
        max_size=5,
    )
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=prompts_with_shared_prefixes, max_new=st.integers(1, 6))
def test_greedy_tokens_identical_across_cache_chunking_and_batching(
    cores: dict[str, EngineCore], prompts: list[list[int]], max_new: int
) -> None:
    def reqs() -> list[GenerateRequest]:
        return [GenerateRequest(f"r{i}", p, greedy(max_new)) for i, p in enumerate(prompts)]

    ref = run_to_completion(cores["reference"], reqs(), together=False)
    expected = {f"r{i}": ref.tokens(f"r{i}") for i in range(len(prompts))}
    assert all(len(v) == max_new for v in expected.values())
    for name, core in cores.items():
        if name == "reference":
            continue
        for together in (False, True):
            got = run_to_completion(core, reqs(), together=together)
            actual = {rid: got.tokens(rid) for rid in expected}
            assert actual == expected, f"{name} (batched={together}) diverged from the reference"


def test_second_request_hits_the_shared_document(cores: dict[str, EngineCore]) -> None:
    """Two prompts = one document + different questions: the second resumes from the deepest checkpoint."""
    core = cores["cache_chunked"]
    assert core.scheduler.flush_cache()
    doc = [(7 * i) % (VOCAB - 1) for i in range(45)]
    first = run_to_completion(core, [GenerateRequest("a", doc + [1, 2, 3], greedy(2))], together=False)
    second = run_to_completion(core, [GenerateRequest("b", doc + [9, 9], greedy(2))], together=False)
    assert first.final("a").cached_tokens == 0
    # The first prompt's last 8 tokens (interval 8) are checkpointed every 2: 44 is the deepest state <= 45.
    assert second.final("b").cached_tokens == 44


def test_pages_and_handed_over_states(cores: dict[str, EngineCore]) -> None:
    """Page size 4 and no copy-on-write: a hit is page-aligned, and the state it takes leaves the cache."""
    core = cores["paged_single_lru"]
    assert core.scheduler.flush_cache()
    doc = [(11 * i) % (VOCAB - 1) for i in range(46)]
    # "a" runs 13 tokens past the document, so its tail checkpoints (checkpoints.py) lie beyond it.
    run_to_completion(core, [GenerateRequest("a", doc + [1, 2, 3] + [5] * 10, greedy(2))], together=False)
    states_before = core.stats().state_slots_cached
    second = run_to_completion(core, [GenerateRequest("b", doc + [9], greedy(2))], together=False)
    assert second.final("b").cached_tokens == 40
    third = run_to_completion(core, [GenerateRequest("c", doc + [8], greedy(2))], together=False)
    # "b" took the state at 40 over (not copied), but it checkpointed the branch point 44 (the last whole page of
    # the tree's KV for its prompt, where no state was): "c" resumes there.
    assert third.final("c").cached_tokens == 44
    assert core.stats().state_slots_cached >= states_before - 1


def test_without_state_snapshots_nothing_is_reused(cores: dict[str, EngineCore]) -> None:
    model_dir = Path(cores["reference"].args.model_path)
    core = make_core(model_dir, mamba_track_interval=8, state_snapshot_on_match=False)
    doc = [(3 * i) % (VOCAB - 1) for i in range(45)]
    run_to_completion(core, [GenerateRequest("a", doc + [1], greedy(2))], together=False)
    got = run_to_completion(core, [GenerateRequest("b", doc + [2], greedy(2))], together=False)
    assert got.final("b").cached_tokens == 0
    s = core.stats()
    assert s.kv_pages_cached == 0 and s.state_slots_cached == 0 and s.state_checkpoints == 0
