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
from runtime.scheduler.step_budget import (
    GRANULARITY,
    MAX_GROWTH,
    MAX_TOKENS,
    MIN_TOKENS,
    SMALL_MIN_TOKENS,
    PauseBudget,
    mean_context,
)
from tests.runtime.test_engine_support import (
    TINY_BUILDERS,
    VOCAB,
    Collected,
    greedy,
    make_core,
    one_torch_thread,
    run_to_completion,
)


def _budget(token_ms: float, decode_ms: float = 0.0, target_ms: float = 150.0) -> int:
    b = PauseBudget(target_ms / 1000, DEFAULT_CPU_DECODING_STEP_TOKENS)
    if decode_ms:
        b.observe(0, 4, decode_ms / 1000)
    b.observe(512, 0, 512 * token_ms / 1000)
    return b.prompt_tokens(4)


def test_slower_prefill_gives_a_smaller_budget_and_faster_a_larger_one() -> None:
    slow, medium, fast = _budget(0.5), _budget(0.25), _budget(0.1)
    assert slow < medium < fast
    assert medium == 600 // GRANULARITY * GRANULARITY  # 150 ms / 0.25 ms per token
    assert all(t % GRANULARITY == 0 for t in (slow, medium, fast))


def test_the_decode_rows_share_the_target() -> None:
    # 150 ms, of which a decode step takes 50: 100 ms of prompt tokens at 0.25 ms.
    assert _budget(0.25, decode_ms=50) == 400 // GRANULARITY * GRANULARITY
    assert _budget(0.25, decode_ms=50) < _budget(0.25)


def test_bounds_and_the_start() -> None:
    assert _budget(50.0) == MIN_TOKENS  # a 0.76B model: steps stay large enough to be efficient
    assert _budget(3.0) == MIN_TOKENS  # 50 tokens fit, but 256 take 5 targets: the fixed part may spiral
    # 150 tokens fit and 256 take under 2 targets: a fixed part too small to spiral, the smaller floor.
    assert _budget(1.0) == 128
    assert _budget(5.0, target_ms=1000) == 192  # the same at any target: 256 tokens within 2 targets
    assert _budget(0.001) == MAX_TOKENS
    assert _budget(0.5, decode_ms=500) == MIN_TOKENS  # decode rows alone over the target
    fresh = PauseBudget(0.15, DEFAULT_CPU_DECODING_STEP_TOKENS)
    fresh.observe(8, 0, 1.0)  # a few tokens: fixed costs, not a rate
    assert fresh.prompt_tokens(4) == DEFAULT_CPU_DECODING_STEP_TOKENS - 4  # nothing timed yet: the fixed default


@pytest.mark.parametrize(
    ("fixed_s", "token_s", "want"),
    [
        (0.34, 0.0153, 256),  # the 0.76B Qwen3-Next, measured: no step meets 100 ms; the floor, no spiral
        (0.0074, 0.0003, 288),  # the demo model, measured: (100 ms - a decode step) / 0.3 ms a token
    ],
)
def test_the_budgets_own_steps_settle(fixed_s: float, token_s: float, want: int) -> None:
    # Step after step the budget is timed on the sizes it gave (4 decode rows beside), from a whole prompt first.
    b = PauseBudget(0.1, DEFAULT_CPU_DECODING_STEP_TOKENS)
    b.observe(576, 0, fixed_s + token_s * 576)
    caps = []
    for _ in range(20):
        caps.append(b.prompt_tokens(4))
        b.observe(caps[-1], 4, fixed_s + token_s * (caps[-1] + 4))
        b.observe(0, 4, fixed_s / 3)  # a decode step: the native path, cheaper than a forward's fixed part
    assert caps[-5:] == [want] * 5
    assert min(caps) >= 256  # no step of the spiral


def test_the_budget_follows_a_slower_host_within_a_few_steps() -> None:
    b = PauseBudget(0.15, DEFAULT_CPU_DECODING_STEP_TOKENS)
    b.observe(512, 0, 512 * 0.00005)
    before = b.prompt_tokens(1)
    for _ in range(6):
        b.observe(512, 0, 512 * 0.0005)  # ten times slower
    after = b.prompt_tokens(1)
    assert after < before / 5
    assert after == pytest.approx(300, abs=GRANULARITY)


def _prompts(b: PauseBudget, fixed_s: float, token_s: float, growth: float, n: int = 2) -> list[tuple[int, int, float]]:
    """The budget's own steps over `n` 8000-token prompts (one decode row beside), each step costing
    fixed + tokens * token_s * (1 + growth * its mean context), as it is timed: (position, tokens, seconds)."""
    steps = []
    for _ in range(n):
        position = 0
        while position < 8000:
            tokens = min(b.prompt_tokens(1, position), 8000 - position)
            context = mean_context([position], [tokens])
            seconds = fixed_s + tokens * token_s * (1 + growth * context)
            b.observe(tokens, 1, seconds, context)
            b.observe(0, 1, 0.001)
            steps.append((position, tokens, seconds))
            position += tokens
    return steps


def test_steps_late_in_a_prompt_stay_within_the_target() -> None:
    # The demo model, measured (2 threads): 139 us a token + 43 ns per prefix token, 10 ms fixed.
    b = PauseBudget(0.1, DEFAULT_CPU_DECODING_STEP_TOKENS)
    second = _second_prompt(_prompts(b, 0.010, 139e-6, 43e-9 / 139e-6))
    assert max(s for _, _, s in second) <= 0.1 * 1.05
    assert max(t for _, t, _ in second) > 2 * second[-2][1]  # a prompt's early steps take more tokens than its late
    flat = PauseBudget(0.1, DEFAULT_CPU_DECODING_STEP_TOKENS)
    flat.fit.add = lambda context, token_s: None  # type: ignore[method-assign]  # the flat average alone
    late = max(s for _, _, s in _second_prompt(_prompts(flat, 0.010, 139e-6, 43e-9 / 139e-6)))
    assert late > 0.1 * 1.1  # the flat average lags behind the prompt's rising cost: 15% over the target


def _second_prompt(steps: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
    return steps[[i for i, (p, _, _) in enumerate(steps) if p == 0][1] :]


def test_a_busy_host_takes_the_demo_model_under_the_256_token_floor() -> None:
    # 2.4 times slower (five other benchmarks on two cores): 256 tokens 7,000 into a prompt take 300 ms.
    b = PauseBudget(0.1, DEFAULT_CPU_DECODING_STEP_TOKENS)
    steps = _prompts(b, 0.015, 335e-6, 43e-9 / 139e-6)
    second = _second_prompt(steps)
    assert min(t for _, t, _ in second) == SMALL_MIN_TOKENS
    assert max(s for _, _, s in second) <= 0.15
    # Before the growth is known (a noisy fit: none here), the steps at the prompt's start set the floor.
    unfitted = PauseBudget(0.1, DEFAULT_CPU_DECODING_STEP_TOKENS)
    unfitted.fit.add = lambda context, token_s: None  # type: ignore[method-assign]
    assert max(s for _, _, s in _prompts(unfitted, 0.015, 335e-6, 43e-9 / 139e-6, n=1)) <= 0.15


def test_the_large_model_keeps_the_floor_along_a_prompt() -> None:
    # The 0.76B Qwen3-Next (0.34 s + 15.3 ms a token), its attention a small part: the floor, never under it.
    b = PauseBudget(0.1, DEFAULT_CPU_DECODING_STEP_TOKENS)
    steps = _prompts(b, 0.34, 0.0153, 2e-5)
    assert {t for p, t, _ in steps[1:] if p + t < 8000} == {MIN_TOKENS}  # (the first: the default, untimed)


def test_a_new_prompt_is_not_priced_below_the_last_steps() -> None:
    b = PauseBudget(0.1, DEFAULT_CPU_DECODING_STEP_TOKENS)
    _prompts(b, 0.010, 139e-6, 43e-9 / 139e-6, n=1)
    late = b.prompt_tokens(1, 7900)
    assert b.prompt_tokens(1, 0) <= 2 * late  # priced at about the last steps' cost until timed
    noisy = PauseBudget(0.1, DEFAULT_CPU_DECODING_STEP_TOKENS)
    for i in range(40):  # costs that rise steeply with context (a host getting busier along the prompt)
        noisy.observe(256, 0, 256 * 1e-6 * (1 + i * 4), context=i * 256.0)
    assert noisy.fit.growth == MAX_GROWTH


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
