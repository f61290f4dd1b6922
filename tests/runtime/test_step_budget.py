"""What a step may compute: the pause target's token budget (runtime/scheduler/step_budget.py PauseBudget) follows
measured step times, an explicit --decoding-step-tokens stays fixed, and --max-prefill-tokens makes prompts that
arrive together finish one after another on the real engine, with the same greedy tokens as batched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridshared.flags.runtime_args import DEFAULT_CPU_DECODING_STEP_TOKENS, DEFAULT_CPU_MAX_PREFILL_TOKENS
from hybridshared.flags.runtime_parser import parse_args
from runtime.core.config import engine_args
from runtime.core.requests import GenerateRequest
from runtime.engine.engine_core import EngineCore
from runtime.scheduler.step_budget import GRANULARITY, MAX_FIXED_SHARE, MAX_TOKENS, PauseBudget
from tests.runtime.test_engine_support import (
    TINY_BUILDERS,
    VOCAB,
    Collected,
    greedy,
    make_core,
    one_torch_thread,
    run_to_completion,
)


def _budget(steps: list[tuple[int, float]], decoding: int = 4, target_ms: float = 100.0) -> int:
    """The budget after prefill steps of (prompt tokens, seconds), each beside `decoding` decode rows."""
    b = PauseBudget(target_ms / 1000, DEFAULT_CPU_DECODING_STEP_TOKENS)
    for tokens, seconds in steps:
        b.observe(tokens, decoding, seconds)
    return b.prompt_tokens(decoding)


def _line(fixed_ms: float, token_ms: float, sizes: list[int], decoding: int = 4) -> list[tuple[int, float]]:
    return [(n, (fixed_ms + token_ms * (n + decoding)) / 1000) for n in sizes]


# Sizes a budget sees: a whole prompt, then its chunks at the cap and their remainder.
SIZES = [576, 256, 256, 64, 256, 256, 160]


def test_slower_prefill_gives_a_smaller_budget_and_faster_a_larger_one() -> None:
    slow, medium, fast = (_budget(_line(8.0, t, SIZES)) for t in (0.5, 0.3, 0.1))
    assert slow < medium < fast
    assert medium == (92 // 0.3 - 4) // GRANULARITY * GRANULARITY  # (100 ms - 8 fixed) / 0.3 ms, less 4 rows
    assert all(t % GRANULARITY == 0 for t in (slow, medium, fast))


def test_a_fixed_cost_is_not_read_as_slow_tokens() -> None:
    # The demo model's prefills (7.4 ms + 0.30 ms a token, measured): small steps cost more per token, and the
    # budget is what fits in the target whatever sizes it was measured on.
    small, large = _budget(_line(7.4, 0.3, [32, 64, 32, 96] * 3)), _budget(_line(7.4, 0.3, [512, 1024, 768] * 4))
    assert small == large == (92.6 // 0.3 - 4) // GRANULARITY * GRANULARITY
    # A per-token average over 32-token steps would be ~0.53 ms a token: a budget of ~160.
    assert _budget([(32, 0.0074 + 0.0003 * 36)] * 3) <= 192  # one size alone cannot tell the parts apart


def test_the_decode_rows_share_the_target() -> None:
    steps = _line(8.0, 0.3, SIZES, decoding=64)
    assert _budget(steps, decoding=64) == (92 // 0.3 - 64) // GRANULARITY * GRANULARITY
    assert _budget(steps, decoding=64) < _budget(_line(8.0, 0.3, SIZES))


def test_a_fixed_cost_over_the_target_gives_efficient_steps_not_a_spiral() -> None:
    # The 0.76B Qwen3-Next on a loaded 2-core host (0.34 s + 15.3 ms a token, measured): no step meets 100 ms;
    # the step is where the fixed cost is MAX_FIXED_SHARE of it, and stays there as the budget's own steps come.
    fixed_s, token_s = 0.34, 0.0153
    want = fixed_s * (1 - MAX_FIXED_SHARE) / MAX_FIXED_SHARE / token_s - 4
    b = PauseBudget(0.1, DEFAULT_CPU_DECODING_STEP_TOKENS)
    b.observe(576, 0, fixed_s + token_s * 576)
    caps = []
    for _ in range(30):
        caps.append(b.prompt_tokens(4))
        b.observe(caps[-1], 4, fixed_s + token_s * (caps[-1] + 4))
    assert len(set(caps[-10:])) == 1 and abs(caps[-1] - want) < GRANULARITY  # (the early steps' clipping: 192)
    # The first steps, before the line has a shape (MIN_SHAPE_STEPS), are a per-token average's 32; then no spiral.
    assert caps[0] == GRANULARITY and min(caps[11:]) >= 128


def test_a_step_slowed_by_the_host_does_not_make_a_long_one() -> None:
    # The demo model's line, the budget's own steps, two of them four times slower (another process had the
    # cores): a line fitted to them as they are would read a large fixed cost and take a step of ~1000 tokens.
    b = PauseBudget(0.1, DEFAULT_CPU_DECODING_STEP_TOKENS)
    b.observe(576, 0, 0.0074 + 0.0003 * 576)
    caps = []
    for i in range(40):
        caps.append(b.prompt_tokens(4))
        b.observe(caps[-1], 4, (0.0074 + 0.0003 * (caps[-1] + 4)) * (4 if i in (9, 14) else 1))
    assert max(caps) <= (92.6 // 0.3 - 4) // GRANULARITY * GRANULARITY
    assert caps[-1] == (92.6 // 0.3 - 4) // GRANULARITY * GRANULARITY


def test_bounds_and_the_start() -> None:
    assert _budget(_line(1.0, 0.0001, SIZES)) == MAX_TOKENS
    assert _budget(_line(500.0, 0.3, SIZES * 2)) == MAX_TOKENS  # a fixed cost this large: as large steps as allowed
    fresh = PauseBudget(0.1, DEFAULT_CPU_DECODING_STEP_TOKENS)
    fresh.observe(0, 4, 1.0)  # a decode step: another path, no prefill timed
    assert fresh.prompt_tokens(4) == DEFAULT_CPU_DECODING_STEP_TOKENS - 4  # nothing timed yet: the fixed default


def test_the_budget_follows_a_slower_host_within_a_few_steps() -> None:
    b = PauseBudget(0.15, DEFAULT_CPU_DECODING_STEP_TOKENS)
    for tokens, seconds in _line(2.0, 0.05, SIZES):
        b.observe(tokens, 4, seconds)
    before = b.prompt_tokens(4)
    for _ in range(6):
        b.observe(512, 4, 516 * 0.0005)  # ten times slower
    after = b.prompt_tokens(4)
    assert after < before / 5
    assert after == pytest.approx(300, abs=2 * GRANULARITY)


@pytest.mark.parametrize(
    ("argv", "cap", "target"),
    [
        ([], DEFAULT_CPU_DECODING_STEP_TOKENS, 0.1),  # CPU default: auto, 100 ms
        (["--decoding-step-tokens", "auto", "--decode-pause-target-ms", "400"], DEFAULT_CPU_DECODING_STEP_TOKENS, 0.4),
        (["--decoding-step-tokens", "96"], 96, 0.0),  # an explicit count stays fixed
        (["--decoding-step-tokens", "-1"], 0, 0.0),
    ],
)
def test_flags_reach_the_scheduler(
    tmp_path_factory: pytest.TempPathFactory, argv: list[str], cap: int, target: float
) -> None:
    model = _model(tmp_path_factory)
    args = engine_args(parse_args(["--model-path", str(model), "--memory-budget-gib", "0.05", *argv]), "cpu")
    args.max_total_tokens, args.max_mamba_cache_size = 4096, 96
    cfg = EngineCore(args).scheduler.config
    assert (cfg.decoding_step_tokens, cfg.decode_pause_target_s) == (cap, pytest.approx(target))
    assert cfg.max_prefill_tokens == DEFAULT_CPU_MAX_PREFILL_TOKENS


_MODEL: list[Path] = []


def _model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not _MODEL:
        _MODEL.append(TINY_BUILDERS["qwen3_next"](Path(tmp_path_factory.mktemp("qwen3_next")) / "model"))
    return _MODEL[0]


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _prompt(n: int, mult: int) -> list[int]:
    return [(mult * i + 1) % (VOCAB - 1) for i in range(n)]


@pytest.mark.parametrize("limit", [DEFAULT_CPU_MAX_PREFILL_TOKENS, 16384])
def test_prompts_that_arrive_together_finish_one_after_another(
    tmp_path_factory: pytest.TempPathFactory, limit: int
) -> None:
    model = _model(tmp_path_factory)
    reqs = [GenerateRequest(f"p{i}", _prompt(100, 3 + 2 * i), greedy(3)) for i in range(3)]
    reqs.append(GenerateRequest("short", _prompt(20, 17), greedy(3)))
    core = make_core(model, max_prefill_tokens=limit, decoding_step_tokens=-1)
    got = Collected()
    for r in reqs:
        core.scheduler.add_request(r, got.callback())
    firsts: list[set[str]] = []
    while core.scheduler.has_work:
        core.step()
        core.check_invariants()
        firsts.append({rid for rid, outs in got.outputs.items() if outs and rid not in set().union(*firsts)})
    if limit == 16384:  # every prompt in one forward: every first token at its end
        assert firsts[0] == {"p0", "p1", "p2", "short"}
    else:  # 100 tokens, then a 20-token prompt fits beside it (120 <= 128), the other 100s one per step
        assert firsts[:3] == [{"p0", "short"}, {"p1"}, {"p2"}]
    reference = make_core(model, disable_radix_cache=True, chunked_prefill_size=-1)
    want = run_to_completion(reference, reqs, together=False)
    assert {r.rid: got.tokens(r.rid) for r in reqs} == {r.rid: want.tokens(r.rid) for r in reqs}
