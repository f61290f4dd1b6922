"""n > 1 on one prefill (runtime/scheduler/fork.py), in-process on a real tiny hybrid model: continuations forked
off a prefill share its KV through the tree and own a copy of its recurrent state; each equals the request run
alone (greedy, and seeded sampling); whatever cannot fork runs as an ordinary request. The pools' invariants
(free + cached + in use == total, nothing lost or doubled) are checked after every step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.core.requests import GenerateRequest, RequestOutput, SamplingParams
from runtime.engine.engine_core import EngineCore
from tests.runtime.test_engine_support import (
    Collected,
    build_tiny_qwen3_next,
    greedy,
    make_core,
    one_torch_thread,
    run_to_completion,
)

PROMPT = list(range(3, 44))  # 41 tokens: not a multiple of 4 (the page-size case below)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3_next(Path(tmp_path_factory.mktemp("fork")) / "model")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _alone(core: EngineCore, params: SamplingParams, prompt: list[int] = PROMPT) -> list[int]:
    out = run_to_completion(core, [GenerateRequest("alone", prompt, params)], together=True).tokens("alone")
    assert core.scheduler.flush_cache()
    return out


def _family(params: list[SamplingParams], prompt: list[int] = PROMPT) -> list[GenerateRequest]:
    return [GenerateRequest(f"r{j}", prompt, p, fork_of="r0" if j else None) for j, p in enumerate(params)]


def test_greedy_forks_equal_the_request_alone_and_share_the_prefill(model_dir: Path) -> None:
    core = make_core(model_dir)
    want = _alone(core, greedy(10))
    before = core.scheduler.stats()
    slots_seen: list[int] = []
    got = Collected()
    for r in _family([greedy(10)] * 4):
        core.scheduler.add_request(r, got.callback())
    while core.scheduler.has_work:
        core.step()
        core.scheduler.check_invariants()
        slots_seen.append(core.scheduler.stats().state_slots_in_use)
    assert [got.tokens(f"r{j}") for j in range(4)] == [want] * 4
    stats = core.scheduler.stats()
    assert stats.state_forks == 3
    assert max(slots_seen) == 4  # one state slot per continuation, counted in the pool while they run
    assert [got.final(f"r{j}").cached_tokens for j in range(4)] == [0, len(PROMPT), len(PROMPT), len(PROMPT)]
    # One prefill: the prompt's tokens were computed once (prompt_tokens - cached_tokens over the 4 requests).
    computed = (stats.prompt_tokens_total - before.prompt_tokens_total) - (
        stats.cached_tokens_total - before.cached_tokens_total
    )
    assert computed == len(PROMPT)


def test_seeded_forks_sample_as_the_same_seed_alone(model_dir: Path) -> None:
    core = make_core(model_dir)

    def seeded(seed: int) -> SamplingParams:
        return SamplingParams(temperature=1.2, max_new_tokens=10, ignore_eos=True, seed=seed)

    want = [_alone(core, seeded(s)) for s in (11, 12, 13)]
    got = run_to_completion(core, _family([seeded(s) for s in (11, 12, 13)]), together=True)
    assert [got.tokens(f"r{j}") for j in range(3)] == want
    assert len({tuple(w) for w in want}) == 3
    assert core.scheduler.stats().state_forks == 2


@pytest.mark.parametrize("overrides", [{"page_size": 4}, {"disable_radix_cache": True}])
def test_without_a_shareable_prefill_they_run_as_ordinary_requests(model_dir: Path, overrides: dict) -> None:
    core = make_core(model_dir, **overrides)
    want = run_to_completion(core, [GenerateRequest("alone", PROMPT, greedy(8))], together=True).tokens("alone")
    got = run_to_completion(core, _family([greedy(8)] * 3), together=True)
    assert [got.tokens(f"r{j}") for j in range(3)] == [want] * 3
    assert core.scheduler.stats().state_forks == 0


def test_aborts_of_held_forks_and_of_their_prefill(model_dir: Path) -> None:
    core = make_core(model_dir)
    want = _alone(core, greedy(6))
    got = Collected()
    for r in _family([greedy(6)] * 3):
        core.scheduler.add_request(r, got.callback())
    assert core.scheduler.stats().num_queue_reqs == 3  # the two held forks count as queued
    assert core.scheduler.abort("r1")  # a held fork: it finishes alone
    assert core.scheduler.abort("r0")  # the prefill it waited for: r2 now prefills by itself
    while core.scheduler.has_work:
        core.step()
        core.scheduler.check_invariants()
    final: dict[str, RequestOutput] = {r: got.final(r) for r in ("r0", "r1", "r2")}
    assert final["r0"].finish_reason["type"] == final["r1"].finish_reason["type"] == "abort"  # type: ignore[index]
    assert got.tokens("r2") == want and core.scheduler.stats().state_forks == 0
