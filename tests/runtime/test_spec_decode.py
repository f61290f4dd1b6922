"""Speculative decoding, engine-level and in-process on tiny real checkpoints: greedy output is
token-identical to plain decoding for every algorithm with the prefix cache on and the pools under pressure;
the target as its own STANDALONE draft accepts every draft (accept length exactly steps + 1), also after
cache hits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.core.requests import GenerateRequest, SamplingParams
from runtime.engine.engine_core import EngineCore
from runtime.engine.pool_setup import EngineStartupError
from runtime.speculative.ngram import NgramDrafter
from tests.runtime.test_engine_support import (
    FAMILIES,
    TINY_BUILDERS,
    VOCAB,
    greedy,
    make_core,
    one_torch_thread,
    run_to_completion,
)

STEPS = 3
# Under pressure: 12 state slots (3 running requests at 4 slots each) and 256 KV tokens, so a handful of
# prompts of up to ~45 tokens evict cached KV and states while others decode.
PRESSURE = {"max_total_tokens": 256, "max_mamba_cache_size": 12, "mamba_track_interval": 8}


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module", params=FAMILIES)
def models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    build = TINY_BUILDERS[request.param]
    root = Path(tmp_path_factory.mktemp(request.param))
    target = build(root / "target")
    dirs = {"target": target, "other": _perturbed_copy(target, root / "other")}
    if request.param == "qwen3_next":  # the family with an MTP layer: NEXTN drafts from added mtp.* tensors
        from tests.runtime.test_spec_mtp import with_mtp_weights

        dirs["mtp"] = with_mtp_weights(target, root / "mtp")
    return dirs


def _perturbed_copy(src: Path, dst: Path, noise: float = 0.05) -> Path:
    """The target with noise on its output head: a draft that agrees with it often, not always."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    generator = torch.Generator().manual_seed(1)
    head = tensors["lm_head.weight"]
    tensors["lm_head.weight"] = head + noise * torch.randn(head.shape, generator=generator)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def cores(models: dict[str, Path]) -> dict[str, EngineCore]:
    target = models["target"]
    spec = {"speculative_num_steps": STEPS}
    extra = {}
    if "mtp" in models:  # same weights as the target plus the MTP layer: the same greedy output
        extra["nextn"] = make_core(
            models["mtp"], speculative_algorithm="NEXTN", chunked_prefill_size=9, **spec, **PRESSURE
        )
    return extra | {
        "reference": make_core(target, disable_radix_cache=True, chunked_prefill_size=-1),
        "ngram": make_core(target, speculative_algorithm="NGRAM", chunked_prefill_size=7, **spec, **PRESSURE),
        "self_draft": make_core(
            target, speculative_algorithm="STANDALONE", speculative_draft_model_path=str(target),
            chunked_prefill_size=7, **spec, **PRESSURE,
        ),
        "other_draft_paged": make_core(
            target, speculative_algorithm="STANDALONE", speculative_draft_model_path=str(models["other"]),
            page_size=4, chunked_prefill_size=12, state_copy_on_write=False, **spec, **PRESSURE,
        ),
    }  # fmt: skip


token = st.integers(0, VOCAB - 2)
prompts_with_shared_prefixes = st.lists(st.lists(token, min_size=1, max_size=30), min_size=1, max_size=2).flatmap(
    lambda prefixes: st.lists(
        st.tuples(st.sampled_from(prefixes), st.lists(token, min_size=1, max_size=12)).map(lambda t: t[0] + t[1]),
        min_size=2,
        max_size=5,
    )
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=prompts_with_shared_prefixes, max_new=st.integers(1, 10))
def test_greedy_tokens_identical_with_and_without_spec(
    cores: dict[str, EngineCore], prompts: list[list[int]], max_new: int
) -> None:
    def reqs() -> list[GenerateRequest]:
        return [GenerateRequest(f"r{i}", p, greedy(max_new)) for i, p in enumerate(prompts)]

    ref = run_to_completion(cores["reference"], reqs(), together=False)
    expected = {f"r{i}": ref.tokens(f"r{i}") for i in range(len(prompts))}
    for name, core in cores.items():
        if name == "reference":
            continue
        got = run_to_completion(core, reqs(), together=True)
        assert {rid: got.tokens(rid) for rid in expected} == expected, f"{name} diverged from plain decoding"
        for rid in expected:
            final = got.final(rid)
            assert final.completion_tokens == max_new
            # Every token after the first comes from a verify round, at most steps + 1 per round.
            assert final.spec_verify_ct * (STEPS + 1) >= max_new - 1
            assert final.spec_verify_ct <= max(max_new - 1, 0)


def test_self_draft_accepts_every_draft_also_after_cache_hits(cores: dict[str, EngineCore]) -> None:
    """The mechanism check: with the target as its own draft every round emits steps + 1 tokens. Later
    requests share a document with earlier ones and resume from cached states under pressure (the known
    failure in the wild: every draft rejected after a cache hit)."""
    core = cores["self_draft"]
    assert core.scheduler.flush_cache()
    assert core.spec is not None
    before = core.spec.counters.correct_drafts, core.spec.counters.proposed_drafts
    doc = [(11 * i + 3) % (VOCAB - 1) for i in range(40)]
    new = 4 * (STEPS + 1)  # the first token comes from prefill, the last round is cut short by one
    reqs = [GenerateRequest(f"q{i}", doc + [i + 1, i + 2], greedy(new)) for i in range(6)]
    got = run_to_completion(core, reqs[:2], together=True)
    got2 = run_to_completion(core, reqs[2:], together=True)
    finals = [got.final(r.rid) for r in reqs[:2]] + [got2.final(r.rid) for r in reqs[2:]]
    assert sum(f.cached_tokens for f in finals) > 0, "no request hit the prefix cache"
    for f in finals:
        assert f.spec_verify_ct == 4
        assert f.completion_tokens / f.spec_verify_ct == STEPS + 1
        assert f.spec_num_correct_drafts == f.completion_tokens - 1 - f.spec_verify_ct + 1
    correct, proposed = core.spec.counters.correct_drafts, core.spec.counters.proposed_drafts
    assert correct - before[0] == proposed - before[1] == 6 * 4 * STEPS
    stats = core.stats()
    assert stats.state_evictions + stats.kv_evictions > 0, "the pools were never under pressure"


def test_other_draft_is_partly_rejected_and_still_exact(cores: dict[str, EngineCore]) -> None:
    stats = cores["other_draft_paged"].stats()
    if stats.spec_verify_calls_total == 0:
        pytest.skip("the property test did not run first")
    assert 0.0 < stats.spec_accept_rate < 1.0, "a different draft model should be right only sometimes"
    assert 1.0 < stats.avg_spec_accept_length < STEPS + 1


def test_stop_token_inside_an_accepted_run_truncates_and_rolls_back(cores: dict[str, EngineCore]) -> None:
    """A stop token among the accepted drafts ends the request there: the same tokens as plain decoding."""
    prompt = [5, 6, 7, 8, 9, 10]
    plain = run_to_completion(cores["reference"], [GenerateRequest("p", prompt, greedy(12))], together=False)
    tokens = plain.tokens("p")
    stop = tokens[5]
    expected = tokens[: tokens.index(stop) + 1]
    core = cores["self_draft"]
    # Not greedy(): its ignore_eos turns stop_token_ids off too, as in SGLang.
    params = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=[stop])
    got = run_to_completion(core, [GenerateRequest("s", prompt, params)], together=False)
    assert got.tokens("s") == expected
    assert got.final("s").finish_reason == {"type": "stop", "matched": stop}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"speculative_algorithm": "NGRAM", "enable_mamba_state_sandbox": False},
            r"Speculative decoding state rollback error.*enable_mamba_state_sandbox = true",
        ),
        ({"speculative_algorithm": "NGRAM", "speculative_eagle_topk": 2}, r"speculative_topk = 1"),
        ({"speculative_algorithm": "STANDALONE"}, r"speculative_draft_model_path"),
        ({"speculative_algorithm": "NEXTN"}, r"no mtp\.\* weights"),
        ({"speculative_algorithm": "MEDUSA"}, r"implements NGRAM, STANDALONE"),
    ],
)
def test_unusable_spec_options_refuse_to_start(
    models: dict[str, Path], overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(EngineStartupError, match=message):
        make_core(models["target"], **overrides)


def test_sandbox_is_sized_as_sglang_scratch_states(cores: dict[str, EngineCore]) -> None:
    core = cores["self_draft"]
    plan = core.pools.plan
    per_request = plan.mamba_pool_bytes // plan.mamba_pool_slots
    assert plan.spec_intermediate_bytes > 0
    assert core.pools.sandbox_slots * per_request == plan.spec_intermediate_bytes
    groups = min(plan.max_running_requests, plan.max_mamba_cache_size // plan.slots_per_request) + 1
    assert core.pools.sandbox_slots == groups * (STEPS + 1)
    first = core.pools.buffers.conv[0].shape[0] - core.pools.sandbox_slots
    assert first == plan.mamba_pool_slots == core.pools.sandbox_first_slot


def test_logprobs_of_verified_tokens_match_plain_decoding(cores: dict[str, EngineCore]) -> None:
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    params = greedy(9)
    plain = run_to_completion(
        cores["reference"], [GenerateRequest("p", prompt, params, return_logprob=True)], together=False
    )
    spec = run_to_completion(
        cores["self_draft"], [GenerateRequest("s", prompt, greedy(9), return_logprob=True)], together=False
    )
    want = [lp for o in plain.outputs["p"] for lp in o.new_token_logprobs or []]
    got = [lp for o in spec.outputs["s"] for lp in o.new_token_logprobs or []]
    assert spec.tokens("s") == plain.tokens("p") and len(got) == len(want) == 9
    assert got == pytest.approx(want, abs=1e-4)


def test_sampled_requests_are_verified_and_finish(cores: dict[str, EngineCore]) -> None:
    """Temperature > 0: every row is sampled with the request's own generator; drafts from the target itself
    are accepted only when the sample agrees, and the request still ends at exactly max_new_tokens."""
    core = cores["self_draft"]
    reqs = [
        GenerateRequest(f"t{i}", [7, 8, 9, i], SamplingParams(temperature=0.8, max_new_tokens=12, seed=i))
        for i in range(3)
    ]
    got = run_to_completion(core, reqs, together=True)
    for r in reqs:
        final = got.final(r.rid)
        assert final.completion_tokens == 12 and len(got.tokens(r.rid)) == 12
        assert 1 <= final.spec_verify_ct <= 11
    again = run_to_completion(core, [GenerateRequest("t0", [7, 8, 9, 0], reqs[0].sampling)], together=False)
    assert again.tokens("t0") == got.tokens("t0"), "a seeded request must be reproducible"


@settings(max_examples=40, deadline=None)
@given(period=st.lists(st.integers(0, 50), min_size=1, max_size=5), repeats=st.integers(2, 4),
       k=st.integers(1, 6))  # fmt: skip
def test_ngram_continues_a_repeating_sequence(period: list[int], repeats: int, k: int) -> None:
    seq = period * repeats
    drafts = NgramDrafter(k).propose_one(seq)
    assert len(drafts) == k
    # The sequence repeats with this period, so its continuation is the period again (if the tail matched).
    assert drafts == (period * (k // len(period) + 2))[:k]


def test_ngram_without_a_match_pads_with_the_last_token() -> None:
    assert NgramDrafter(3).propose_one([1, 2, 3, 4]) == [4, 4, 4]
    assert NgramDrafter(4).propose_one([5, 6, 7, 5, 6]) == [7, 5, 6, 7]  # copied with overlap


def test_ngram_rounds_without_a_match_are_plain_decode_steps(cores: dict[str, EngineCore]) -> None:
    """A round in which no request's tail occurred earlier runs as a plain decode step (no padded drafts are
    verified); the output is still plain decoding's, and each such round counts one token per request."""
    core = cores["ngram"]
    assert core.spec is not None
    counters = core.spec.counters
    new = 6
    for first in range(1, VOCAB - 1):  # a one-token prompt whose first output differs: no match in the first round
        ref = run_to_completion(cores["reference"], [GenerateRequest("p", [first], greedy(new))], together=False)
        if ref.tokens("p")[0] != first:
            break
    before = counters.plain_rounds, counters.proposed_drafts, counters.verify_calls
    got = run_to_completion(core, [GenerateRequest("p", [first], greedy(new))], together=True)
    assert got.tokens("p") == ref.tokens("p")
    plain = counters.plain_rounds - before[0]
    verified = counters.verify_calls - before[2] - plain  # one request: a plain round is one request-round
    assert plain >= 1
    assert counters.proposed_drafts - before[1] == verified * STEPS
    assert got.final("p").spec_verify_ct == plain + verified


def test_a_lone_requests_verify_rounds_are_native_chains(models: dict[str, Path], cores: dict[str, EngineCore]) -> None:
    """One running request's verify forward (one sequence, every row's logits, the state after each position
    checkpointed) runs as one chain of the native step; the output is still plain decoding's."""
    core = make_core(models["target"], speculative_algorithm="NGRAM", speculative_num_steps=STEPS)
    native = core.runner.native_decode
    assert native is not None and native.extends
    prompt = list(range(VOCAB - 1))  # every token but EOS: each round's tail occurred earlier, drafts to verify
    ref = run_to_completion(cores["reference"], [GenerateRequest("p", prompt, greedy(10))], together=False)
    got = run_to_completion(core, [GenerateRequest("p", prompt, greedy(10))], together=True)
    assert got.tokens("p") == ref.tokens("p")
    assert native.verifies > 0


def test_draft_tokens_other_than_steps_plus_one_are_adjusted_as_sglang(
    models: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    spec = {"speculative_algorithm": "NGRAM", "speculative_num_steps": 2, "speculative_num_draft_tokens": 6}
    core = make_core(models["target"], **spec)
    assert core.spec is not None and core.spec.config.num_draft_tokens == 3
    assert core.pools.sandbox_slots % 3 == 0
    assert "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1" in caplog.text


def test_launch_offers_the_algorithms_the_runtime_implements() -> None:
    """Every algorithm `hybridctl launch` may pass resolves to one the engine builds a drafter for."""
    from hybridctl.launch.builtin_flags import RUNTIME_FLAGS
    from runtime.core.speculative_config import resolve_spec_config

    offered = RUNTIME_FLAGS["--speculative-algorithm"].choices
    assert offered
    for name in offered:
        config = resolve_spec_config(name, None, None, 1, "draft" if name == "STANDALONE" else None, sandbox=True)
        assert config is not None and config.algorithm in ("NGRAM", "STANDALONE", "EAGLE"), name
