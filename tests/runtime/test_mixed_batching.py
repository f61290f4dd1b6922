"""Mixed batching: while requests decode, a long prompt's chunks and one decode row per decoding request run in one
step (`Scheduler.schedule` → `BatchBuilder.mixed`), no step computes more than `decoding_step_tokens` tokens, and
greedy outputs are token-identical with mixing on, off (prefill and decode steps alternate) and each request run
alone: a hypothesis property over random prompts, on a Gated DeltaNet family (through the native C step, which
takes a mixed step as two calls, and through one torch forward with both kinds of row) and a Mamba2 family."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.core.batch import ScheduledBatch
from runtime.core.requests import GenerateRequest, SamplingParams
from runtime.engine.engine_core import EngineCore
from runtime.scheduler.request import Req
from tests.runtime.test_engine_support import (
    TINY_BUILDERS,
    VOCAB,
    Collected,
    greedy,
    make_core,
    one_torch_thread,
    run_to_completion,
)

STEP_TOKENS = 24  # the cap while requests decode: a 150-token prompt takes several mixed steps
# (family, native decode): the Qwen3-Next family with its C step (a mixed step as two C calls) and without it
# (one torch forward whose recurrent layers run the decode rows through their decode step), and a Mamba2 family.
SETUPS = [("qwen3_next", "auto"), ("qwen3_next", "off"), ("nemotron_h", "auto")]


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        family: build(Path(tmp_path_factory.mktemp(family)) / "model")
        for family, build in TINY_BUILDERS.items()
        if family in {f for f, _ in SETUPS}
    }


@pytest.fixture(scope="module", params=SETUPS, ids=[f"{f}-native-{n}" for f, n in SETUPS])
def cores(request: pytest.FixtureRequest, model_dirs: dict[str, Path]) -> dict[str, EngineCore]:
    family, native = request.param
    model_dir = model_dirs[family]
    common: dict[str, object] = {"native_decode": native, "chunked_prefill_size": 64}
    return {
        # No cache, each prompt in one forward, one request at a time: nothing to mix.
        "reference": make_core(model_dir, disable_radix_cache=True, chunked_prefill_size=-1, native_decode=native),
        "mixed": make_core(model_dir, decoding_step_tokens=STEP_TOKENS, **common),
        "alternating": make_core(model_dir, enable_mixed_chunk=False, decoding_step_tokens=STEP_TOKENS, **common),
        # No cap, no chunking: a prompt that arrives while others decode is one chunk (over 128 tokens: the
        # chunked delta rule and SSD scan, not the short-extend kernels), its decode rows beside it.
        "mixed_uncapped": make_core(model_dir, decoding_step_tokens=-1, native_decode=native, chunked_prefill_size=-1),
        # The CPU default: the cap follows a pause target from measured step times (so the steps' composition
        # varies run to run); a target this short keeps it at its floor, a few chunks per long prompt.
        "mixed_paused": make_core(model_dir, decode_pause_target_ms=0.5, **common),
    }


def step(core: EngineCore) -> ScheduledBatch[Req] | None:
    """EngineCore.step, keeping the batch: the test reads what each step ran."""
    batch = core.scheduler.schedule()
    if batch is not None:
        core.scheduler.postprocess(batch, core.runner.run(batch))
        core.scheduler.check_invariants()
    return batch


@dataclass
class Step:
    batch: ScheduledBatch[Req]
    decoding: int  # requests decoding when the step was scheduled


def run_with_late_arrivals(
    core: EngineCore, decoding: list[GenerateRequest], late: list[GenerateRequest], after_steps: int
) -> tuple[Collected, list[Step]]:
    """Queue `decoding`, run `after_steps` steps, queue `late` (long prompts), run to the end."""
    got = Collected()
    for r in decoding:
        core.scheduler.add_request(r, got.callback())
    steps: list[Step] = []
    for i in range(100_000):
        if i == after_steps:
            for r in late:
                core.scheduler.add_request(r, got.callback())
        elif i > after_steps and not core.scheduler.has_work:
            return got, steps
        before = sum(not r.in_prefill for r in core.scheduler.running)
        batch = step(core)
        if batch is not None:
            steps.append(Step(batch, before))
    raise AssertionError("the engine made no progress")


token = st.integers(0, VOCAB - 2)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    short=st.lists(st.lists(token, min_size=1, max_size=12), min_size=1, max_size=3),
    long=st.lists(st.lists(token, min_size=30, max_size=150), min_size=1, max_size=2),
    decode_tokens=st.integers(8, 30),
    after_steps=st.integers(1, 4),
)
def test_greedy_tokens_identical_with_mixing_on_and_off(
    cores: dict[str, EngineCore], short: list[list[int]], long: list[list[int]], decode_tokens: int, after_steps: int
) -> None:
    def reqs() -> tuple[list[GenerateRequest], list[GenerateRequest]]:
        decoding = [GenerateRequest(f"s{i}", p, greedy(decode_tokens)) for i, p in enumerate(short)]
        return decoding, [GenerateRequest(f"l{i}", p, greedy(4)) for i, p in enumerate(long)]

    decoding, late = reqs()
    ref = run_to_completion(cores["reference"], decoding + late, together=False)
    expected = {r.rid: ref.tokens(r.rid) for r in decoding + late}
    for name in ("mixed", "alternating", "mixed_uncapped", "mixed_paused"):
        core = cores[name]
        assert core.scheduler.flush_cache()
        got, steps = run_with_late_arrivals(core, *reqs(), after_steps=after_steps)
        assert {rid: got.tokens(rid) for rid in expected} == expected, f"{name} diverged from the reference"
        mixed = [s.batch for s in steps if s.batch.decode_rows]
        if name == "alternating":
            assert not mixed
        else:  # the long prompts arrive while the short ones decode (at least 8 tokens after step 1..4)
            assert any(b.num_tokens > b.decode_rows for b in mixed)
            assert all(b.decode_rows == s.decoding for s in steps for b in [s.batch] if s.batch.mode == "extend")
        if name in ("mixed", "alternating"):  # while requests decode, no step computes more than the cap
            assert all(s.batch.num_tokens <= STEP_TOKENS for s in steps if s.decoding)


def test_a_long_prompt_rides_with_decodes_under_the_cap(cores: dict[str, EngineCore]) -> None:
    """An 150-token prompt arriving while two requests decode: every step until its first token carries both
    decode rows and at most STEP_TOKENS tokens, so the decoding requests get a token at every step."""
    core = cores["mixed"]
    decoding = [GenerateRequest(f"s{i}", [1 + i, 2, 3], greedy(200)) for i in range(2)]
    long = [GenerateRequest("long", [(5 * i) % (VOCAB - 1) for i in range(150)], greedy(1))]
    got, steps = run_with_late_arrivals(core, decoding, long, after_steps=2)
    during = [s.batch for s in steps if any(r.rid == "long" for r in s.batch.reqs)]
    assert len(during) >= 150 // STEP_TOKENS
    assert all(b.decode_rows == 2 and b.num_tokens <= STEP_TOKENS for b in during)
    assert len(got.tokens("long")) == 1 and all(len(got.tokens(r.rid)) == 200 for r in decoding)


def test_prompt_logprobs_in_a_mixed_step(cores: dict[str, EngineCore]) -> None:
    """A prompt asking for every position's logprobs (all_logits) shares its steps with decode rows: the decode
    rows' logits are the forward's last rows; the prompt's logprobs and tokens match the reference's."""
    prompt = [(3 * i) % (VOCAB - 1) for i in range(60)]

    def scoring() -> GenerateRequest:
        sampling = SamplingParams(temperature=0.0, max_new_tokens=2, ignore_eos=True)
        return GenerateRequest("score", prompt, sampling, return_logprob=True, logprob_start_len=0)

    ref = run_to_completion(cores["reference"], [scoring()], together=False)
    decoding = [GenerateRequest("s0", [4, 5, 6], greedy(40))]
    got, steps = run_with_late_arrivals(cores["mixed"], decoding, [scoring()], after_steps=1)
    assert any(s.batch.decode_rows and s.batch.all_logits for s in steps)
    assert got.tokens("score") == ref.tokens("score")
    prompt_logprobs = next(o.input_token_logprobs for o in got.outputs["score"] if o.input_token_logprobs)
    expected = next(o.input_token_logprobs for o in ref.outputs["score"] if o.input_token_logprobs)
    assert prompt_logprobs == pytest.approx(expected, abs=1e-4)
