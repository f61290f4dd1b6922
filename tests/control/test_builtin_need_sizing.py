"""The bundled runtime's pools are cut to what the request cap can use; the memory budget is an upper bound.

`size_builtin_pools` (THE sizing function the runtime, plan, init and doctor share) first splits the budget as
SGLang does, then `cap_to_need` cuts each pool: KV tokens to max_running_requests x context_len, state slots to
the running requests' slots plus one checkpoint every mamba_track_interval tokens of that KV.
"""

from __future__ import annotations

import pytest

from hybridshared.sizing.runtime_pools import RuntimePoolInputs, size_builtin_pools
from hybridshared.units import GIB

# The peer benchmark model (benchmarks/peers/peer_model.py) held in fp32: 2 full-attention layers of 2 KV heads
# x 64, and 6 Gated DeltaNet layers of conv window 512 x 3 and state 4 x 64 x 64.
KV_PER_TOKEN = 2 * 2 * 64 * 2 * 4
STATE_PER_REQUEST = 6 * (512 * 3 * 4 + 4 * 64 * 64 * 4)
WEIGHTS = 45 << 20


def _pools(budget_gib: float = 4.0, **kwargs: object):  # type: ignore[no-untyped-def]
    return size_builtin_pools(
        RuntimePoolInputs(
            device_bytes=int(budget_gib * GIB),
            mem_fraction_static=0.85,
            weight_bytes=WEIGHTS,
            state_bytes_per_request=STATE_PER_REQUEST,
            kv_bytes_per_token=KV_PER_TOKEN,
            **kwargs,  # type: ignore[arg-type]
        )
    )


def test_llama_cpp_context_and_concurrency_cut_both_pools() -> None:
    pools = _pools(context_len=16384, max_running_requests=8, mamba_track_interval=64)
    plan = pools.plan
    assert plan.max_running_requests == 8 and plan.limited_by == "requested"
    assert plan.max_total_num_tokens == 8 * 16384
    # 8 requests x 4 slots (extra_buffer without overlap) + a checkpoint every 64 tokens of 8 x 16384 KV tokens
    assert plan.slots_per_request == 4 and plan.max_mamba_cache_size == 8 * 4 + 8 * 16384 // 64
    assert plan.mamba_pool_slots == plan.max_mamba_cache_size + 1
    assert plan.mamba_pool_bytes == plan.mamba_pool_slots * STATE_PER_REQUEST
    assert plan.kv_pool_bytes == plan.max_total_num_tokens * KV_PER_TOKEN
    assert "KV tokens" in pools.capped_to_need and "state slots" in pools.capped_to_need
    # The cut pools are far below the budget they were cut from.
    assert plan.kv_pool_bytes + plan.mamba_pool_bytes < pools.inputs.pool_budget_bytes / 3


def test_the_budget_stays_the_upper_bound() -> None:
    need = _pools(context_len=16384, max_running_requests=8).plan
    small = _pools(budget_gib=0.5, context_len=16384, max_running_requests=8).plan
    assert small.kv_pool_bytes + small.mamba_pool_bytes <= need.kv_pool_bytes + need.mamba_pool_bytes
    assert small.kv_pool_bytes + small.mamba_pool_bytes <= int(0.5 * GIB * 0.85) - WEIGHTS
    assert small.max_total_num_tokens < 8 * 16384


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_kv_need_is_page_aligned_and_no_checkpoints_without_the_radix_cache(page_size: int) -> None:
    plan = _pools(
        context_len=1000, max_running_requests=3, page_size=page_size, mamba_track_interval=256,
        disable_radix_cache=True,
    ).plan  # fmt: skip
    assert plan.max_total_num_tokens == -(-3000 // page_size) * page_size
    assert plan.max_mamba_cache_size == 3  # radix cache off: one slot per request, no checkpoints


def test_state_pool_bound_request_cap_keeps_its_slots() -> None:
    """No request cap given: SGLang's estimate, then the state pool's K // ratio sets it; K is the need."""
    pools = _pools(context_len=32768)
    plan = pools.plan
    assert plan.limited_by == "state_pool" and plan.max_mamba_cache_size // plan.slots_per_request == (
        plan.max_running_requests
    )
    assert "state slots" not in pools.capped_to_need
