"""The dense expert dispatch (small batches) and the accelerator path's dispatches compute what the sorted sparse
dispatch computes."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.models.layers import moe as moe_layer
from runtime.models.layers.grouped_moe import gathered_experts, grouped_experts
from runtime.models.layers.moe import Experts, SparseMoE, swiglu


def _experts(num_experts: int, hidden: int, inter: int, seed: int) -> Experts:
    gen = torch.Generator().manual_seed(seed)
    e = Experts(num_experts, hidden, inter)
    with torch.no_grad():
        e.gate_up_proj.copy_(torch.randn(e.gate_up_proj.shape, generator=gen) * 0.1)
        e.down_proj.copy_(torch.randn(e.down_proj.shape, generator=gen) * 0.1)
    return e


@settings(max_examples=25, deadline=None)
@given(
    tokens=st.integers(1, 40),
    num_experts=st.sampled_from([2, 4, 8, 16]),
    top_k=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_dense_equals_sparse(tokens: int, num_experts: int, top_k: int, seed: int) -> None:
    top_k = min(top_k, num_experts)
    experts = _experts(num_experts, 32, 24, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(tokens, 32, generator=gen)
    scores = torch.softmax(torch.randn(tokens, num_experts, generator=gen), dim=-1)
    weights, ids = torch.topk(scores, top_k, dim=-1)
    with torch.inference_mode():
        dense = experts.forward_dense(x, ids, weights)
        sparse = experts.forward_sparse(x, ids, weights)
    torch.testing.assert_close(dense, sparse, rtol=1e-5, atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(num_experts=st.sampled_from([2, 4, 8, 16]), top_k=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_one_token_path_equals_sparse_bit_for_bit(num_experts: int, top_k: int, seed: int) -> None:
    top_k = min(top_k, num_experts)
    experts = _experts(num_experts, 32, 24, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(1, 32, generator=gen)
    weights, ids = torch.topk(torch.softmax(torch.randn(1, num_experts, generator=gen), dim=-1), top_k, dim=-1)
    with torch.inference_mode():
        assert torch.equal(experts.forward_one_token(x, ids, weights), experts.forward_sparse(x, ids, weights))
        assert torch.equal(experts(x, ids, weights), experts.forward_sparse(x, ids, weights))


def test_dense_only_where_cheap() -> None:
    small = _experts(8, 256, 128, 0)  # the demo model's expert shapes
    assert not small.dense_is_cheaper(tokens=1, top_k=2)  # 2 of 8 experts: reading all 8 costs more
    assert small.dense_is_cheaper(tokens=8, top_k=2)
    assert not small.dense_is_cheaper(tokens=2048, top_k=2)  # a long prefill: 4x the FLOPs is real time
    big = Experts(512, 64, 64)  # many experts (Qwen3-Next's real count): one token hits 10 of 512
    assert not big.dense_is_cheaper(tokens=1, top_k=10)


def test_moe_block_same_output_either_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole block (router + experts + shared expert) agrees between a dense-sized and a sparse-sized call:
    the rows of a big batch, run sparse, equal the same rows run a few at a time, dense. The big batch in one C
    call (runtime/native/moe_rows.c) is as close to an fp64 reference as torch's ops are (its router and gates
    round apart from torch's, so outputs of magnitude ~18 differ from torch's by a few 1e-6)."""
    torch.manual_seed(0)
    moe = SparseMoE(64, 8, 2, 32, 32, norm_topk_prob=True)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape) * 0.2)
    x = torch.randn(600, 64)
    with torch.inference_mode():
        assert not moe.experts.dense_is_cheaper(600, 2)
        in_c = moe(x)
        monkeypatch.setattr(moe_layer, "ROWS_MIN_TOKENS", 1 << 62)
        whole = moe(x)
        assert moe.experts.dense_is_cheaper(4, 2)
        parts = torch.cat([moe(x[i : i + 4]) for i in range(0, 600, 4)])
        reference = copy.deepcopy(moe).double()(x.double())
    torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-6)
    torch_error = (whole.double() - reference).abs().max().item()
    assert (in_c.double() - reference).abs().max().item() <= 2 * torch_error


@settings(max_examples=25, deadline=None)
@given(
    tokens=st.integers(1, 40),
    num_experts=st.sampled_from([2, 8, 72]),
    top_k=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_accelerator_dispatches_equal_sparse(tokens: int, num_experts: int, top_k: int, seed: int) -> None:
    """The accelerator path's two host-sync-free dispatches (runtime/models/layers/grouped_moe.py): the grouped GEMM
    and its fallback where CUDA's grouped GEMM does not take the dtype or card (a copy of the chosen experts'
    weights, which only a GPU would otherwise run)."""
    top_k = min(top_k, num_experts)
    experts = _experts(num_experts, 32, 24, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(tokens, 32, generator=gen)
    weights, ids = torch.topk(torch.softmax(torch.randn(tokens, num_experts, generator=gen), dim=-1), top_k, dim=-1)
    with torch.inference_mode():
        sparse = experts.forward_sparse(x, ids, weights)
        for dispatch in (grouped_experts, gathered_experts):
            got = dispatch(x, ids, weights, experts.gate_up_proj, experts.down_proj, swiglu)
            torch.testing.assert_close(got, sparse, rtol=1e-5, atol=1e-6)
