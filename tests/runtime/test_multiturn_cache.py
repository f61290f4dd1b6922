"""Engine level: end-of-request states (a follow-up turn hits the whole previous conversation), the no_buffer
strategy (second request sharing a document misses, a later one hits), exact repeats and prompts sharing most of
an earlier one (the tail checkpoints), and long prompts whose checkpoints land on and between the kernels' chunk
boundaries, all token-identical to a cache-off engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.core.requests import GenerateRequest
from runtime.engine.engine_core import EngineCore
from runtime.scheduler.checkpoints import TAIL_STEPS
from tests.runtime.test_checkpoint_states import BUILDERS
from tests.runtime.test_engine_support import (
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


@pytest.fixture(scope="module", params=list(BUILDERS))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return BUILDERS[request.param](Path(tmp_path_factory.mktemp(request.param)) / "model")


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> EngineCore:
    return make_core(model_dir, disable_radix_cache=True, chunked_prefill_size=-1)


def _run(core: EngineCore, rid: str, prompt: list[int], max_new: int = 3) -> tuple[list[int], int]:
    got = run_to_completion(core, [GenerateRequest(rid, prompt, greedy(max_new))], together=False)
    return got.tokens(rid), got.final(rid).cached_tokens


def _doc(n: int, mult: int) -> list[int]:
    return [(mult * i + 1) % (VOCAB - 1) for i in range(n)]


def test_follow_up_turn_hits_the_whole_previous_conversation(model_dir: Path, reference: EngineCore) -> None:
    core = make_core(model_dir, mamba_track_interval=16)
    prompt = _doc(37, 5)
    answer, cached = _run(core, "turn1", prompt, max_new=5)
    assert cached == 0
    follow_up = prompt + answer + [3, 1, 4, 1, 5]
    tokens, cached = _run(core, "turn2", follow_up)
    # The end-of-request state is after prompt + answer[:-1]: the last answer token was never fed back.
    assert cached == len(prompt) + len(answer) - 1
    assert tokens == _run(reference, "ref", follow_up)[0]
    core.check_invariants()


def test_no_buffer_second_request_misses_a_later_one_hits(model_dir: Path, reference: EngineCore) -> None:
    core = make_core(model_dir, mamba_radix_cache_strategy="no_buffer", chunked_prefill_size=-1)
    assert core.stats().mamba_radix_cache_strategy == "no_buffer"
    assert core.stats().mamba_track_interval == 0  # no periodic checkpoints: end-of-sequence states only
    doc = _doc(40, 7)
    prompts = [doc + [200, 201, 202], doc + [210, 211], doc + [220, 221, 222, 223], doc + [230]]
    results = [_run(core, f"q{i}", p) for i, p in enumerate(prompts)]
    # The first caches only its end state; the second shares the document's KV but no state there, so it
    # misses and checkpoints the branch point (the document's end); from then on the document hits.
    assert [cached for _, cached in results] == [0, 0, 40, 40]
    for (tokens, _), p in zip(results, prompts, strict=True):
        assert tokens == _run(reference, "ref", p)[0]
    core.check_invariants()


def test_exact_repeat_resumes_at_the_deepest_usable_state(model_dir: Path, reference: EngineCore) -> None:
    """A repeated prompt must compute its last token (for the logits), so the state after the whole prompt
    (or after prompt + output) cannot serve it: the prompt's prefill checkpoints len - 1 (checkpoints.py), and
    every repeat resumes there, computing one token."""
    core = make_core(model_dir, mamba_track_interval=16)
    prompt = _doc(45, 3)
    first, cached = _run(core, "a", prompt)
    assert cached == 0
    for rid in ("b", "c"):
        again, cached = _run(core, rid, prompt)
        assert (again, cached) == (first, len(prompt) - 1)
    assert first == _run(reference, "ref", prompt)[0]
    core.check_invariants()


@pytest.mark.parametrize("shared", [33, 40, 42, 46])
def test_a_prompt_sharing_most_of_an_earlier_one_resumes_within_a_tail_step(
    model_dir: Path, reference: EngineCore, shared: int
) -> None:
    """The same document with another question: the earlier prompt checkpointed its last `interval` tokens on a
    grid interval // TAIL_STEPS fine, so the later one recomputes less than a tail step before its own tokens
    (it resumed at the interval grid before: 32 of these 33-46 shared tokens)."""
    interval = 16
    core = make_core(model_dir, mamba_track_interval=interval)
    doc = _doc(48, 7)
    first = doc[:shared] + _doc(48 - shared, 11)  # differs from `second` right after the shared tokens
    second = doc[:shared] + [5, 6, 7]
    _run(core, "first", first)
    tokens, cached = _run(core, "second", second)
    step = interval // TAIL_STEPS
    assert shared // step * step <= cached <= shared
    assert tokens == _run(reference, "ref", second)[0]
    core.check_invariants()


def test_with_fewer_slots_than_checkpoints_the_latest_are_kept(model_dir: Path, reference: EngineCore) -> None:
    """A long prompt wants more checkpoints than the pool has slots (a real model's 2048-token prompt: ~35 with
    31 slots): the earliest are the ones skipped, so a prompt sharing all but its last tokens still resumes on the
    tail grid near its end, not where the slots ran out."""
    interval = 8
    core = make_core(model_dir, mamba_track_interval=interval, max_mamba_cache_size=6)
    doc = _doc(96, 5)  # 11 interval points + the tail grid: far more than the 5 spare slots
    _run(core, "first", doc + [9, 9, 9])
    second = doc + [5, 6, 7]
    tokens, cached = _run(core, "second", second)
    assert cached >= len(doc) - interval // TAIL_STEPS
    assert tokens == _run(reference, "ref", second)[0]
    core.check_invariants()


@pytest.mark.parametrize("in_forward", [True, False], ids=["in_forward", "split"])
def test_long_prompts_identical_with_checkpoints_on_and_off_chunk_grid(
    model_dir: Path, reference: EngineCore, in_forward: bool
) -> None:
    """Prompts of ~200 tokens, checkpoints every 48 (on the 16-token Mamba grid, off the 64-token delta-rule
    grid), chunked prefill of 100 and whole; shared documents so later prompts resume mid-prompt."""
    doc = _doc(150, 11)
    prompts = [doc + _doc(40, 13), doc + _doc(55, 17), _doc(190, 19), doc + _doc(41, 23)]
    expected = [_run(reference, f"ref{i}", p, max_new=4)[0] for i, p in enumerate(prompts)]
    for chunk in (100, -1):
        core = make_core(model_dir, mamba_track_interval=48, chunked_prefill_size=chunk)
        core.scheduler.config.in_forward_checkpoints = in_forward
        for together in (False, True):
            reqs = [GenerateRequest(f"r{i}", p, greedy(4)) for i, p in enumerate(prompts)]
            got = run_to_completion(core, reqs, together=together)
            assert [got.tokens(f"r{i}") for i in range(len(prompts))] == expected, (chunk, together)
        assert core.stats().state_checkpoints > 0
        assert core.stats().cached_tokens_total > 0
