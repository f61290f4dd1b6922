"""size_pools invariants, slots per request, strategy resolution and the errors' wording."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hybridshared.sizing.pool_sizing import (
    GIB,
    MIB,
    PoolInputs,
    PoolSizingError,
    resolve_strategy,
    size_pools,
    slots_per_request,
)

MODES = [("no_buffer", False), ("extra_buffer", True), ("extra_buffer", False), ("extra_buffer_lazy", True)]


@st.composite
def fitting_inputs(draw: st.DrawFn) -> PoolInputs:
    strategy, overlap = draw(st.sampled_from(MODES))
    return PoolInputs(
        pool_bytes=draw(st.integers(8 * GIB, 120 * GIB)),
        mamba_state_bytes_per_request=draw(st.integers(4 * MIB, 160 * MIB)),
        kv_bytes_per_token=draw(st.integers(2_048, 120_000)),
        page_size=draw(st.sampled_from([1, 16, 64])),
        mamba_full_memory_ratio=draw(st.floats(0.2, 3.0)),
        disable_radix_cache=draw(st.booleans()),
        strategy=strategy,
        overlap_schedule=overlap,
        speculative_num_draft_tokens=draw(st.sampled_from([0, 4])),
        context_len=draw(st.sampled_from([8192, 131072])),
    )


@settings(max_examples=150, deadline=None)
@given(inp=fitting_inputs())
def test_pools_fit_the_budget_and_the_requests_fit_the_pools(inp: PoolInputs) -> None:
    try:
        plan = size_pools(inp)
    except PoolSizingError:
        return  # too small a budget for this state size: covered by the error tests
    assert plan.mamba_pool_slots == plan.max_mamba_cache_size + 1
    assert plan.mamba_pool_bytes == plan.mamba_pool_slots * inp.mamba_state_bytes_per_request
    assert plan.mamba_pool_bytes + plan.spec_intermediate_bytes + plan.kv_pool_bytes <= inp.pool_bytes
    assert plan.max_total_num_tokens % inp.page_size == 0
    assert plan.kv_pool_bytes == plan.max_total_num_tokens * inp.kv_bytes_per_token
    assert 1 <= plan.max_running_requests <= plan.max_mamba_cache_size // plan.slots_per_request
    assert plan.max_running_requests <= plan.max_total_num_tokens // 2
    assert not inp.speculative_num_draft_tokens or plan.spec_intermediate_bytes > 0


# Found by hypothesis: 1 GiB more lets SGLang cap one more request under speculative decoding (13 -> 16 slots,
# 3 -> 4 requests), and its per-capped-request draft scratch (kv_cache_configurator.py: per state x (capped + 1)
# x draft tokens, 671 MB more here) comes out of the KV budget: 1737034 -> 1687960 tokens. That is SGLang's formula.
_SPEC_STEP = PoolInputs(
    pool_bytes=8 * GIB, mamba_state_bytes_per_request=167_749_565, kv_bytes_per_token=2_048, page_size=1,
    mamba_full_memory_ratio=1.8125, disable_radix_cache=False, strategy="extra_buffer", overlap_schedule=False,
    speculative_num_draft_tokens=4, context_len=8192,
)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(inp=fitting_inputs(), extra=st.integers(1 * GIB, 40 * GIB))
@example(inp=_SPEC_STEP, extra=1 * GIB)
def test_more_memory_never_means_fewer_slots_or_tokens(inp: PoolInputs, extra: int) -> None:
    """More memory never means fewer state slots, nor fewer KV tokens unless it bought more speculative scratch
    (another capped request's draft states)."""
    try:
        small = size_pools(inp)
    except PoolSizingError:
        return
    big = size_pools(PoolInputs(**{**inp.__dict__, "pool_bytes": inp.pool_bytes + extra}))
    assert big.max_mamba_cache_size >= small.max_mamba_cache_size
    more_scratch = big.spec_intermediate_bytes > small.spec_intermediate_bytes
    assert big.max_total_num_tokens >= small.max_total_num_tokens or more_scratch


def test_explicit_slots_and_radix_off_request_cap() -> None:
    base = dict(pool_bytes=20 * GIB, mamba_state_bytes_per_request=50 * MIB, kv_bytes_per_token=20_000)
    fixed = size_pools(PoolInputs(**base, max_mamba_cache_size=90))
    assert (fixed.max_mamba_cache_size, fixed.k_source, fixed.max_running_requests) == (
        90,
        "max_mamba_cache_size",
        30,
    )
    off = size_pools(PoolInputs(**base, disable_radix_cache=True, max_running_requests=64))
    assert (off.max_mamba_cache_size, off.slots_per_request, off.max_running_requests) == (64, 1, 64)


@pytest.mark.parametrize(
    ("radix_off", "strategy", "overlap", "slots"),
    [
        (True, "extra_buffer", True, 1),
        (False, "no_buffer", False, 3),
        (False, "extra_buffer", False, 4),
        (False, "extra_buffer", True, 5),
        (False, "extra_buffer_lazy", True, 4),
    ],
)
def test_slots_per_request(radix_off: bool, strategy: str, overlap: bool, slots: int) -> None:
    """kv_cache_configurator.py:3062-3088 + allocation_sizing.py get_mamba_tracking_slots."""
    got = slots_per_request(disable_radix_cache=radix_off, strategy=strategy, overlap_schedule=overlap)
    assert got == slots


def test_budget_too_small_for_one_slot_names_the_numbers_and_the_keys() -> None:
    with pytest.raises(PoolSizingError) as err:
        size_pools(PoolInputs(pool_bytes=100 * MIB, mamba_state_bytes_per_request=73 * MIB, kv_bytes_per_token=24576))
    msg = str(err.value)
    assert "max_mamba_cache_size would be -1" in msg and "73.00 MiB" in msg
    assert "memory.mem_fraction_static" in msg and "bfloat16" in msg


def test_state_pool_eating_everything_is_an_error() -> None:
    with pytest.raises(PoolSizingError, match="leave nothing of the"):
        size_pools(
            PoolInputs(
                pool_bytes=1 * GIB,
                mamba_state_bytes_per_request=10 * MIB,
                kv_bytes_per_token=1000,
                max_mamba_cache_size=200,
            )
        )


def test_too_few_slots_for_one_request_is_an_error() -> None:
    with pytest.raises(PoolSizingError, match="too small to serve any request: 2 slots at 5 slots per request"):
        size_pools(
            PoolInputs(
                pool_bytes=4 * GIB,
                mamba_state_bytes_per_request=10 * MIB,
                kv_bytes_per_token=1000,
                max_mamba_cache_size=2,
                strategy="extra_buffer",
                overlap_schedule=True,
            )
        )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("mamba_state_bytes_per_request", 0, "no recurrent state"),
        ("page_size", 0, "cache.radix_cache_page_size"),
        ("mamba_full_memory_ratio", 0.0, "memory.mamba_full_memory_ratio"),
        ("strategy", "auto", "resolve 'auto' with resolve_strategy first"),
        ("max_running_requests", 0, "max_running_requests must be >= 1"),
    ],
)
def test_invalid_inputs(field: str, value: object, message: str) -> None:
    base = dict(pool_bytes=20 * GIB, mamba_state_bytes_per_request=50 * MIB, kv_bytes_per_token=20_000)
    with pytest.raises(PoolSizingError, match=message):
        size_pools(PoolInputs(**{**base, field: value}))


def test_auto_strategy_follows_sglang() -> None:
    """arg_groups/overrides.py:477-486."""
    on = resolve_strategy("auto", overlap_schedule=True)
    assert (on.strategy, on.overlap_schedule) == ("extra_buffer", True)
    paged = resolve_strategy("auto", overlap_schedule=False, page_size=64)
    assert (paged.strategy, paged.overlap_schedule) == ("extra_buffer", False)
    plain = resolve_strategy("auto", overlap_schedule=False)
    assert (plain.strategy, plain.overlap_schedule) == ("no_buffer", False)
    unsupported = resolve_strategy("auto", overlap_schedule=True, linear_attn_backend="flashinfer")
    assert (unsupported.strategy, unsupported.overlap_schedule) == ("no_buffer", False)
    radix_off = resolve_strategy("extra_buffer_lazy", disable_radix_cache=True, overlap_schedule=True)
    assert radix_off.overlap_schedule is True


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"requested": "no_buffer", "overlap_schedule": True}, "--disable-overlap-schedule"),
        ({"requested": "no_buffer", "overlap_schedule": False, "page_size": 16}, "only supports page size 1"),
        ({"requested": "extra_buffer_lazy", "pd_disaggregation": True}, "unsupported under PD"),
        ({"requested": "extra_buffer_lazy", "overlap_schedule": False}, "requires the overlap schedule"),
        (
            {"requested": "extra_buffer", "mamba_track_interval": 2, "speculative_num_draft_tokens": 4},
            ">= spec",
        ),
        (
            {"requested": "extra_buffer", "mamba_track_interval": 100, "page_size": 64},
            "multiple of the page size",
        ),
        ({"requested": "extra_buffer", "supports_extra_buffer": False}, "extra_buffer support"),
        ({"requested": "ping_pong"}, "is not one of auto"),
    ],
)
def test_strategy_validations(kwargs: dict, message: str) -> None:
    requested = kwargs.pop("requested")
    with pytest.raises(PoolSizingError, match=message):
        resolve_strategy(requested, **kwargs)


def test_limited_by_names_the_binding_bound() -> None:
    base = dict(pool_bytes=40 * GIB, mamba_state_bytes_per_request=1 * MIB, kv_bytes_per_token=20_000)
    # Plenty of state: SGLang's estimate (KV tokens / context * 512, at least 2048) binds.
    assert size_pools(PoolInputs(**base, context_len=1_000_000)).limited_by == "estimate"
    assert size_pools(PoolInputs(**base, max_running_requests=100)).limited_by == "requested"
    assert size_pools(PoolInputs(**base, speculative_num_draft_tokens=4)).max_running_requests == 48
    state_bound = size_pools(PoolInputs(**{**base, "mamba_state_bytes_per_request": 200 * MIB}))
    assert (state_bound.limited_by, state_bound.capped_by_mamba) == ("state_pool", True)
    few_tokens = PoolInputs(**base, max_running_requests=4000, max_mamba_cache_size=12_000, max_total_tokens=1000)
    assert (size_pools(few_tokens).limited_by, size_pools(few_tokens).max_running_requests) == (
        "kv_tokens",
        500,
    )
