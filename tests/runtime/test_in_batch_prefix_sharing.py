"""In-batch prefix sharing (runtime/scheduler/prefix_sharing.py): requests that share a prefix and arrive together
compute it once; the followers wait only until the leader has cached it (or leaves), an unrelated request does
not wait at all, and every output stays token-identical to a cache-off engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.core.batch import ForwardBatch
from runtime.core.requests import GenerateRequest
from runtime.engine.engine_core import EngineCore
from runtime.scheduler.prefix_sharing import shared_prefix_len
from tests.runtime.test_checkpoint_states import BUILDERS
from tests.runtime.test_engine_support import (
    VOCAB,
    Collected,
    greedy,
    make_core,
    one_torch_thread,
    run_to_completion,
)

SUFFIX = 8
# Prompts that arrive together share one prefill step (SGLang's default --max-prefill-tokens; the CPU default
# prefills them one after another): the steps these tests count are those of batched prompts.
BATCHED = 16384


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module", params=list(BUILDERS))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return BUILDERS[request.param](Path(tmp_path_factory.mktemp(request.param)) / "model")


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> EngineCore:
    return make_core(model_dir, disable_radix_cache=True, chunked_prefill_size=-1)


def _tokens(n: int, mult: int, offset: int = 1) -> list[int]:
    return [(mult * i + offset) % (VOCAB - 1) for i in range(n)]


def _group(shared: int, n: int) -> list[GenerateRequest]:
    """n prompts: the same `shared` tokens, then SUFFIX tokens of their own (their first tokens all differ)."""
    prefix = _tokens(shared, 7)
    return [GenerateRequest(f"g{i}", prefix + _tokens(SUFFIX, 11, offset=40 + i), greedy(4)) for i in range(n)]


def _count_prefill_tokens(core: EngineCore) -> list[int]:
    """Prompt tokens of every extend forward the model runs (the real model, observed, not replaced; a mixed
    step's decode rows are not prompt tokens)."""
    counts: list[int] = []
    run = core.runner.forward

    def counting(fb: ForwardBatch) -> object:
        if fb.mode == "extend":
            counts.append(int(fb.input_ids.numel()) - fb.decode_rows)
        return run(fb)

    core.runner.forward = counting  # type: ignore[method-assign]
    return counts


def _reference_tokens(reference: EngineCore, reqs: list[GenerateRequest]) -> dict[str, list[int]]:
    got = run_to_completion(reference, reqs, together=True)
    return {r.rid: got.tokens(r.rid) for r in reqs}


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
@pytest.mark.parametrize("strategy", ["extra_buffer", "no_buffer"])
@pytest.mark.parametrize("shared", [96, 90])  # on the 32-token checkpoint grid, and off it (a share point)
def test_requests_submitted_together_compute_the_shared_prefix_once(
    model_dir: Path, reference: EngineCore, policy: str, strategy: str, shared: int
) -> None:
    core = make_core(
        model_dir,
        mamba_track_interval=32,
        schedule_policy=policy,
        mamba_radix_cache_strategy=strategy,
        max_prefill_tokens=BATCHED,
    )
    prefill = _count_prefill_tokens(core)
    group = _group(shared, 4)
    unrelated = GenerateRequest("other", _tokens(50, 13, offset=3), greedy(4))
    reqs = [group[0], unrelated, *group[1:]]
    got = Collected()
    for r in reqs:
        core.scheduler.add_request(r, got.callback())
    core.step()
    core.check_invariants()
    # The first forward: the leader and the unrelated request (not held back); the followers wait.
    assert prefill == [shared + SUFFIX + 50]
    assert set(got.outputs) == {"g0", "other"}
    while core.scheduler.has_work:
        core.step()
        core.check_invariants()
    followers = [r.rid for r in group[1:]]
    assert [got.final(rid).cached_tokens for rid in followers] == [shared] * 3
    assert sum(prefill) == (shared + SUFFIX) + 50 + 3 * SUFFIX  # the shared prefix was computed once
    assert core.stats().cache_hit_rate == pytest.approx(3 * shared / (4 * (shared + SUFFIX) + 50))
    want = _reference_tokens(reference, reqs)
    assert {r.rid: got.tokens(r.rid) for r in reqs} == want


def test_without_it_followers_recompute_the_prefix(model_dir: Path, reference: EngineCore) -> None:
    core = make_core(model_dir, mamba_track_interval=32, max_prefill_tokens=BATCHED)
    core.scheduler.config.in_batch_prefix_min_tokens = 0
    prefill = _count_prefill_tokens(core)
    group = _group(96, 4)
    got = run_to_completion(core, group, together=True)
    assert prefill == [4 * (96 + SUFFIX)]  # what the feature saves: one forward computing the prefix 4 times
    assert all(got.final(r.rid).cached_tokens == 0 for r in group)
    assert {r.rid: got.tokens(r.rid) for r in group} == _reference_tokens(reference, group)


@pytest.mark.parametrize("sharing", [True, False])
def test_follower_waits_only_until_the_chunked_leader_has_cached_the_prefix(model_dir: Path, sharing: bool) -> None:
    # 40-token chunks: the leader computes its 64 shared + 8 own tokens in two forwards.
    core = make_core(
        model_dir, mamba_track_interval=32, chunked_prefill_size=40, max_prefill_tokens=BATCHED, decoding_step_tokens=-1
    )
    # The leader's tail checkpoints (every 8 of its last 32 tokens: 40, 48, 56, 64) put a state at 40 in the tree
    # after its first chunk: waiting for 64 then gains the follower 24 tokens, worth it above 16.
    core.scheduler.config.in_batch_prefix_min_tokens = 16 if sharing else 0
    leader = GenerateRequest("leader", _tokens(64, 7) + _tokens(SUFFIX, 11, offset=40), greedy(4))
    follower = GenerateRequest("follower", _tokens(64, 7) + _tokens(SUFFIX, 11, offset=90), greedy(4))
    got = Collected()
    for r in (leader, follower):
        core.scheduler.add_request(r, got.callback())
    sched = core.scheduler
    core.step()  # leader 0 -> 40: the whole budget
    core.step()  # leader 40 -> 72 (the state after the shared 64 tokens goes into the tree); 8 tokens of budget left
    if not sharing:  # the follower takes the spare budget and computes the shared prefix itself
        assert not sched.waiting
        return
    assert [r.rid for r in sched.waiting] == ["follower"]
    core.step()  # the leader decodes its second token; the follower is admitted, the leader is not done
    assert not sched.waiting and [r.rid for r in sched.running] == ["leader", "follower"]
    while sched.has_work:
        core.step()
        core.check_invariants()
    assert got.final("follower").cached_tokens == 64


def test_follower_is_admitted_when_its_leader_aborts(model_dir: Path) -> None:
    core = make_core(model_dir, mamba_track_interval=64, chunked_prefill_size=32, max_prefill_tokens=BATCHED)
    prefix = _tokens(128, 7)
    leader = GenerateRequest("leader", prefix + [5] * SUFFIX, greedy(4))
    follower = GenerateRequest("follower", prefix + [6] * SUFFIX, greedy(4))
    got = Collected()
    for r in (leader, follower):
        core.scheduler.add_request(r, got.callback())
    core.step()  # leader 0 -> 32; no checkpoint yet (the first is at 64)
    assert [r.rid for r in core.scheduler.waiting] == ["follower"]
    assert core.scheduler.abort("leader")
    core.step()
    assert not core.scheduler.waiting and [r.rid for r in core.scheduler.running] == ["follower"]
    while core.scheduler.has_work:
        core.step()
        core.check_invariants()
    assert got.final("follower").finish_reason == {"type": "length", "length": 4}
    assert got.final("follower").cached_tokens == 0


def test_cache_off_never_holds_anyone_back(model_dir: Path) -> None:
    core = make_core(model_dir, disable_radix_cache=True, max_prefill_tokens=BATCHED)
    prefill = _count_prefill_tokens(core)
    run_to_completion(core, _group(96, 3), together=True)
    assert prefill == [3 * (96 + SUFFIX)]


@pytest.fixture(scope="module")
def sharing_cores(model_dir: Path) -> dict[str, EngineCore]:
    """Engines where sharing kicks in from 4 tokens, so short prompts exercise it: chunked, paged, no_buffer."""
    cores = {
        "chunked": make_core(model_dir, chunked_prefill_size=7, mamba_track_interval=8),
        "whole_lpm": make_core(model_dir, chunked_prefill_size=-1, mamba_track_interval=8, schedule_policy="lpm"),
        "paged": make_core(model_dir, page_size=4, chunked_prefill_size=12, mamba_track_interval=8),
        "no_buffer": make_core(model_dir, chunked_prefill_size=9, mamba_radix_cache_strategy="no_buffer"),
    }
    for core in cores.values():
        core.scheduler.config.in_batch_prefix_min_tokens = 4
    return cores


_token = st.integers(0, VOCAB - 2)
_prompts = st.lists(st.lists(_token, min_size=4, max_size=40), min_size=1, max_size=2).flatmap(
    lambda prefixes: st.lists(
        st.tuples(st.sampled_from(prefixes), st.lists(_token, min_size=1, max_size=10)).map(lambda t: t[0] + t[1]),
        min_size=2,
        max_size=5,
    )
)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=_prompts)
def test_sharing_keeps_greedy_outputs_identical(
    sharing_cores: dict[str, EngineCore], reference: EngineCore, prompts: list[list[int]]
) -> None:
    def reqs() -> list[GenerateRequest]:
        return [GenerateRequest(f"p{i}", p, greedy(3)) for i, p in enumerate(prompts)]

    want = _reference_tokens(reference, reqs())
    for name, core in sharing_cores.items():
        core.scheduler.flush_cache()
        got = run_to_completion(core, reqs(), together=True)
        assert {r.rid: got.tokens(r.rid) for r in reqs()} == want, name


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [([], [1], 0), ([1, 2, 3], [1, 2, 3], 3), ([1, 2, 3], [1, 2], 2), ([1, 2, 3], [1, 9, 3], 1), ([4], [5], 0)],
)
def test_shared_prefix_len(a: list[int], b: list[int], want: int) -> None:
    assert shared_prefix_len(a, b) == want


def test_shared_prefix_len_long() -> None:
    a = list(range(1000))
    for cut in (0, 1, 499, 500, 998, 999):
        b = a[:cut] + [-1] + a[cut + 1 :]
        assert shared_prefix_len(a, b) == cut
