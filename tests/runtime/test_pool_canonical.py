"""Canonical pool allocation for the compiled path (runtime/engine/pool_setup.py): with --enable-torch-compile on
CPU the pool tensors are allocated at the next power of two of the planned slots, so that flag sets whose pools
round alike trace the same graphs (inductor's cache hits, tests/runtime/test_torch_compile.py proves it); the pool
the engine uses, and every number it reports, stays the planner's. No compile here: the pools are sized only."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from runtime.core.config import EngineArgs
from runtime.engine.pool_setup import Pools, canonical_slots, size_and_allocate
from runtime.models.loader import load_model


@given(st.integers(1, 1 << 40))
def test_canonical_slots_is_the_next_power_of_two(n: int) -> None:
    c = canonical_slots(n)
    assert c >= n and c & (c - 1) == 0 and (c == 1 or c // 2 < n)
    assert canonical_slots(c) == c


def _pools(model_dir: Path, **kw: object) -> Pools:
    args = EngineArgs(model_path=str(model_dir), device="cpu", **kw)  # type: ignore[arg-type]
    model = load_model(str(model_dir), dtype=torch.float32, device="cpu")
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return size_and_allocate(args, model.layout(), weight_bytes, torch.float32)


def _allocated(pools: Pools) -> tuple[int, int]:
    b = pools.buffers
    tokens = {t.shape[0] for t in (*b.k, *b.v)}
    states = {t.shape[0] for t in (*b.conv, *b.ssm)}
    assert len(tokens) == len(states) == 1
    return tokens.pop(), states.pop()


@pytest.mark.parametrize(
    "flags",
    [
        {"memory_budget_gib": 0.2},
        {"memory_budget_gib": 0.3},
        {"memory_budget_gib": 0.2, "context_length": 1024, "max_running_requests": 8},
    ],
    ids=["budget-0.2", "budget-0.3", "ctx-1024-x8"],
)
def test_compiled_pools_are_planned_alike_and_allocated_canonically(demo_model_dir: Path, flags: dict) -> None:
    eager = _pools(demo_model_dir, **flags)
    compiled = _pools(demo_model_dir, enable_torch_compile=True, **flags)
    # The pool the engine uses is the planner's, compile or not.
    assert compiled.plan == eager.plan
    assert (compiled.num_token_slots, compiled.num_state_slots) == (eager.num_token_slots, eager.num_state_slots)
    assert compiled.used_bytes() == eager.used_bytes()
    used = (eager.plan.max_total_num_tokens, eager.plan.mamba_pool_slots)
    assert _allocated(eager) == used  # eager: allocated as planned
    assert _allocated(compiled) == tuple(map(canonical_slots, used))
    assert sum(compiled.used_bytes()) == eager.plan.kv_pool_bytes + eager.plan.mamba_pool_bytes


def test_two_budgets_share_one_allocation_shape(demo_model_dir: Path) -> None:
    small = _pools(demo_model_dir, enable_torch_compile=True, memory_budget_gib=0.2)
    big = _pools(demo_model_dir, enable_torch_compile=True, memory_budget_gib=0.3)
    assert small.plan.max_total_num_tokens != big.plan.max_total_num_tokens
    assert small.plan.mamba_pool_slots != big.plan.mamba_pool_slots
    assert _allocated(small) == _allocated(big)


def test_elastic_pool_is_not_rounded(demo_model_dir: Path) -> None:
    # The elastic pool lays its own buffer over the planned bytes (and keeps the decode eager).
    pools = _pools(demo_model_dir, enable_torch_compile=True, enable_elastic_memory_pool=True, memory_budget_gib=0.2)
    assert (pools.allocated_token_slots, pools.allocated_state_slots) == (
        pools.plan.max_total_num_tokens,
        pools.plan.mamba_pool_slots,
    )
