"""Sampling, stopping and queue policy, on a real tiny model in-process."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.core.requests import GenerateRequest, SamplingError, SamplingParams
from runtime.engine.engine_core import EngineCore
from runtime.scheduler.request import Req
from runtime.scheduler.sampling import sample, sample_row
from tests.runtime.test_engine_support import (
    VOCAB,
    Collected,
    build_tiny_qwen3_next,
    greedy,
    make_core,
    one_torch_thread,
    run_to_completion,
)


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineCore]:
    with one_torch_thread():
        yield make_core(build_tiny_qwen3_next(Path(tmp_path_factory.mktemp("sampling")) / "model"))


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _run(core: EngineCore, prompt: list[int], params: SamplingParams, rid: str = "x") -> Collected:
    return run_to_completion(core, [GenerateRequest(rid, prompt, params)], together=True)


def test_seeded_sampling_repeats_and_differs_by_seed(core: EngineCore) -> None:
    p = dict(temperature=1.5, max_new_tokens=12, ignore_eos=True)
    a = _run(core, [1, 2, 3], SamplingParams(seed=7, **p)).tokens("x")
    b = _run(core, [1, 2, 3], SamplingParams(seed=7, **p)).tokens("x")
    c = _run(core, [1, 2, 3], SamplingParams(seed=8, **p)).tokens("x")
    assert a == b and a != c


def test_top_k_1_is_greedy(core: EngineCore) -> None:
    g = _run(core, [4, 5, 6], greedy(8)).tokens("x")
    k1 = _run(core, [4, 5, 6], SamplingParams(temperature=1.0, top_k=1, max_new_tokens=8, ignore_eos=True))
    assert k1.tokens("x") == g


def test_top_k_top_p_min_p_restrict_the_support() -> None:
    logits = torch.tensor([5.0, 4.0, 1.0, 0.0, -1.0])
    gen = torch.Generator().manual_seed(0)
    seen_k = {sample_row(logits, SamplingParams(top_k=2), gen) for _ in range(200)}
    assert seen_k == {0, 1}
    # softmax ≈ [.72, .26, .013, ...]: top_p 0.9 keeps the first two (the one crossing 0.9 stays in)
    seen_p = {sample_row(logits, SamplingParams(top_p=0.9), gen) for _ in range(200)}
    assert seen_p == {0, 1}
    seen_min = {sample_row(logits, SamplingParams(min_p=0.5), gen) for _ in range(200)}
    assert seen_min == {0}


def test_stop_token_ids_and_eos(core: EngineCore) -> None:
    free = _run(core, [8, 9], greedy(10)).tokens("x")
    stop_at = free[3]
    got = _run(core, [8, 9], SamplingParams(temperature=0, max_new_tokens=10, stop_token_ids=[stop_at]))
    first = free.index(stop_at)
    assert got.tokens("x") == free[: first + 1]
    assert got.final("x").finish_reason == {"type": "stop", "matched": stop_at}


def test_stop_strings_use_the_tokenizer(core: EngineCore) -> None:
    free = _run(core, [10, 11], greedy(10)).tokens("x")
    assert core.tokenizer is not None
    text = core.tokenizer.decode(free[:5])
    stop = text[-1] if text else None
    if not stop:
        pytest.skip("the tiny model's 5th token decodes to nothing printable")
    got = _run(core, [10, 11], SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True, stop=[stop]))
    reason = got.final("x").finish_reason
    assert reason == {"type": "stop", "matched": stop}
    assert stop in core.tokenizer.decode(got.tokens("x")) and len(got.tokens("x")) <= 5


def test_length_and_logprobs(core: EngineCore) -> None:
    got = run_to_completion(core, [GenerateRequest("x", [1, 2], greedy(4), return_logprob=True)], together=True)
    final = got.final("x")
    assert final.finish_reason == {"type": "length", "length": 4}
    assert final.completion_tokens == 4 and final.prompt_tokens == 2
    logprobs = [lp for o in got.outputs["x"] for lp in (o.new_token_logprobs or [])]
    assert len(logprobs) == 4 and all(lp <= 0.0 for lp in logprobs)


def test_bad_requests_fail_alone_with_a_reason(core: EngineCore) -> None:
    got = Collected()
    core.scheduler.add_request(GenerateRequest("empty", [], greedy(2)), got.callback())
    core.scheduler.add_request(GenerateRequest("long", [1] * 5000, greedy(2)), got.callback())
    for rid, words in (("empty", "empty"), ("long", "context length")):
        reason = got.final(rid).finish_reason
        assert reason is not None and reason["type"] == "abort" and words in reason["message"]
    assert not core.scheduler.has_work


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"temperature": -1}, "temperature must be >= 0"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"top_p": 0}, "top_p must be in (0, 1]"),
        ({"top_k": 0}, "top_k must be -1 (disabled) or >= 1"),
        ({"top_k": 1.5}, "top_k must be an integer"),
        ({"min_p": 2}, "min_p must be in [0, 1]"),
        ({"max_new_tokens": -1}, "max_new_tokens must be >= 0"),
        ({"seed": 2**64}, "seed must fit in 64 bits"),
        ({"min_new_tokens": 5, "max_new_tokens": 4}, "min_new_tokens must be in [0, max_new_tokens(4)]"),
        ({"logit_bias": {1: float("inf")}}, "logit_bias values must be finite numbers"),
    ],
)
def test_sampling_params_out_of_range_cannot_be_built(values: dict[str, Any], fragment: str) -> None:
    """In-process callers (no HTTP parser in front) meet the same one check: a request the sampler cannot
    use never reaches the scheduler."""
    with pytest.raises(SamplingError, match="^" + re.escape(fragment)):
        SamplingParams(**values)


def test_streaming_outputs_are_incremental(core: EngineCore) -> None:
    got = _run(core, [3, 3, 3], greedy(5))
    outs = got.outputs["x"]
    assert len(outs) == 5 and [len(o.new_token_ids) for o in outs] == [1] * 5
    assert [o.finished for o in outs] == [False] * 4 + [True]
    assert [o.completion_tokens for o in outs] == [1, 2, 3, 4, 5]


def test_lpm_admits_the_longest_cached_prefix_first(tmp_path: Path) -> None:
    core = make_core(
        build_tiny_qwen3_next(tmp_path / "m"),
        schedule_policy="lpm",
        mamba_track_interval=4,
        max_running_requests=1,
    )
    doc = [(5 * i) % (VOCAB - 1) for i in range(32)]
    run_to_completion(core, [GenerateRequest("warm", doc + [1], greedy(1))], together=True)
    order: list[str] = []
    got = Collected()
    for rid, prompt in (("cold", [99] * 33), ("hit", doc + [2])):
        cb = got.callback()

        def record(o, cb=cb, rid=rid):  # type: ignore[no-untyped-def]
            if o.finished:
                order.append(rid)
            cb(o)

        core.scheduler.add_request(GenerateRequest(rid, prompt, greedy(1)), record)
    while core.scheduler.has_work:
        core.step()
    assert order == ["hit", "cold"]
    assert got.final("hit").cached_tokens == 32


def test_greedy_batch_picks_each_rows_first_maximum() -> None:
    """The batched greedy path (max's indices) agrees with argmax, ties and -inf rows included."""
    gen = torch.Generator().manual_seed(0)
    params = [SamplingParams(temperature=0)] * 8
    for _ in range(50):
        logits = torch.randint(0, 4, (8, 64), generator=gen).float()  # many ties
        logits[3] = float("-inf")
        assert sample(logits, params, [None] * 8) == torch.argmax(logits, dim=-1).tolist()


def test_greedy_batch_matches_torch_on_nan_views_and_16_bit_logits() -> None:
    """The NumPy argmax path gives torch's indices: NaN counts as the maximum (its first one), a strided view and
    bfloat16 logits (cast to float32 first) pick what torch.argmax picks, one row or many."""
    gen = torch.Generator().manual_seed(1)
    for rows in (1, 3, 8):
        params = [SamplingParams(temperature=0)] * rows
        logits = torch.randint(0, 3, (rows, 97), generator=gen).float()
        logits[0, 5] = logits[0, 50] = float("nan")
        assert sample(logits, params, [None] * rows) == torch.argmax(logits, dim=-1).tolist()
        assert sample(logits, params, [None] * rows)[0] == 5
        wide = torch.randn(rows, 130, generator=gen)
        view = wide[:, 3:120]  # not contiguous
        assert sample(view, params, [None] * rows) == torch.argmax(view, dim=-1).tolist()
        half = torch.randn(rows, 64, generator=gen).to(torch.bfloat16)
        assert sample(half, params, [None] * rows) == torch.argmax(half.float(), dim=-1).tolist()
        with torch.inference_mode():
            assert sample(logits.clone(), params, [None] * rows) == torch.argmax(logits, dim=-1).tolist()


def test_plain_greedy_batches_sample_as_the_general_path(core: EngineCore) -> None:
    """A batch of plain greedy requests samples with one argmax; the same batch with one request asking for
    logprobs (which changes no token) goes through penalties, grammar masks and per-row sampling: the same tokens
    for every request either way, and the logprobs arrive."""
    prompts = [[(5 * i + j) % 200 + 3 for j in range(6 + i)] for i in range(4)]

    def run(tag: str, logprob_row: int) -> tuple[list[list[int]], Any]:
        assert core.scheduler.flush_cache()  # the second run computes the prompts again, as the first did
        reqs = [
            GenerateRequest(f"{tag}{i}", p, greedy(8), return_logprob=i == logprob_row) for i, p in enumerate(prompts)
        ]
        got = run_to_completion(core, reqs, together=True)
        return [got.tokens(f"{tag}{i}") for i in range(len(prompts))], got

    plain, _ = run("plain", -1)
    general, got = run("general", 2)
    assert plain == general
    assert all(len(t) == 8 for t in plain)
    assert len([lp for o in got.outputs["general2"] for lp in (o.new_token_logprobs or [])]) == 8


def test_plain_greedy_is_decided_by_every_option_that_changes_sampling() -> None:
    def req(params: SamplingParams, **kw: Any) -> Req:
        r = Req("r", [1], params, lambda out: None, kw.pop("return_logprob", False))
        for k, v in kw.items():
            setattr(r, k, v)
        return r

    assert req(greedy(4)).plain_greedy
    assert req(SamplingParams(temperature=0.7, top_k=1)).plain_greedy  # top_k 1 is greedy
    assert not req(SamplingParams(temperature=0.7)).plain_greedy
    assert not req(greedy(4, frequency_penalty=0.5)).plain_greedy
    assert not req(greedy(4, min_new_tokens=2)).plain_greedy
    assert not req(greedy(4, logit_bias={3: 1.0})).plain_greedy
    assert not req(greedy(4), return_logprob=True).plain_greedy
    assert not req(greedy(4), grammar=object()).plain_greedy
