"""The bf16 AMX prefill experts (runtime/native/moe_prefill.c) compute what torch's bf16 sorted dispatch computes
(rounding where it rounds: a bf16 ulp apart at most, from the matmuls' summation order), and the same bits on any
thread count."""

from __future__ import annotations

import pytest
import torch

from runtime.models.layers.moe import Experts
from runtime.models.layers.sigmoid_moe import Relu2Experts
from runtime.native import moe_prefill

needs_amx = pytest.mark.skipif(moe_prefill.library() is None, reason="no AMX-BF16 here: the torch path runs")


def _case(
    tokens: int, experts: int, hidden: int, inter: int, top_k: int, seed: int
) -> tuple[Experts, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    e = Experts(experts, hidden, inter)
    with torch.no_grad():
        e.gate_up_proj.copy_(torch.randn(e.gate_up_proj.shape, generator=gen) * 0.1)
        e.down_proj.copy_(torch.randn(e.down_proj.shape, generator=gen) * 0.1)
    x = torch.randn(tokens, hidden, generator=gen)
    scores = torch.softmax(torch.randn(tokens, experts, generator=gen), dim=-1)
    weights, ids = torch.topk(scores, top_k, dim=-1)
    return e.to(torch.bfloat16), x.bfloat16(), ids, weights.bfloat16()


@needs_amx
@pytest.mark.parametrize(
    ("tokens", "experts", "hidden", "inter", "top_k"),
    [(2, 4, 64, 32, 1), (37, 8, 64, 64, 2), (600, 2, 96, 32, 2), (513, 16, 128, 96, 4)],
)
@pytest.mark.parametrize("weights_dtype", [torch.bfloat16, torch.float32])
def test_matches_torch_bf16_dispatch(
    tokens: int, experts: int, hidden: int, inter: int, top_k: int, weights_dtype: torch.dtype
) -> None:
    """600 tokens on 2 experts: more rows than one scratch chunk holds (512), run as 2 x 300; 513: odd row blocks.
    fp32 routing weights (Kimi-Linear's): the terms still round to bf16 as they are added, as torch's do."""
    e, x, ids, weights = _case(tokens, experts, hidden, inter, top_k, seed=tokens)
    weights = weights.to(weights_dtype)
    exact = Experts(experts, hidden, inter)
    exact.load_state_dict({k: v.float() for k, v in e.state_dict().items()})
    with torch.inference_mode():
        ref = exact.forward_sparse(x.float(), ids, weights.float())
        torch_bf16 = e.forward_sparse(x, ids, weights).float()
        ours = moe_prefill.routed_experts(x, ids, weights, e.gate_up_proj, e.down_proj)
        via_forward = e(x, ids, weights)
    assert ours.dtype == torch.float32
    ulp = 2.0**-7 * float(ref.abs().max())  # a bf16 ulp at the outputs' largest magnitude
    assert (ours - torch_bf16).abs().max() <= ulp
    assert (ours - ref).abs().mean() <= 1.1 * (torch_bf16 - ref).abs().mean()  # no further from fp32 on the whole
    torch.testing.assert_close(via_forward, ours.bfloat16(), rtol=0, atol=0)


@needs_amx
@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.bfloat16])
def test_relu2_experts_match_torch_bf16_dispatch(weights_dtype: torch.dtype) -> None:
    """Nemotron-H's experts (up only, relu^2): fp32 routing weights sum in fp32, bf16 ones in bf16, as torch does."""
    gen = torch.Generator().manual_seed(3)
    e = Relu2Experts(8, 64, 96)
    with torch.no_grad():
        e.up_proj.copy_(torch.randn(e.up_proj.shape, generator=gen) * 0.1)
        e.down_proj.copy_(torch.randn(e.down_proj.shape, generator=gen) * 0.1)
    e = e.to(torch.bfloat16)
    x = torch.randn(300, 64, generator=gen).bfloat16()
    weights, ids = torch.topk(torch.sigmoid(torch.randn(300, 8, generator=gen)), 2, dim=-1)
    weights = weights.to(weights_dtype)
    with torch.inference_mode():
        torch_bf16 = e.forward_sorted(x, ids, weights).float()
        fp32_sum = weights_dtype == torch.float32
        ours = moe_prefill.routed_experts(x, ids, weights, e.up_proj, e.down_proj, gated=False, fp32_sum=fp32_sum)
        via_forward = e(x, ids, weights)
    ulp = 2.0**-7 * float(torch_bf16.abs().max())
    assert (ours - torch_bf16).abs().max() <= ulp
    torch.testing.assert_close(via_forward, ours.bfloat16(), rtol=0, atol=0)


@needs_amx
def test_same_bits_on_any_thread_count() -> None:
    e, x, ids, weights = _case(200, 8, 64, 64, 2, seed=7)
    before = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            outs.append(moe_prefill.routed_experts(x, ids, weights, e.gate_up_proj, e.down_proj))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_refuses_what_it_cannot_take() -> None:
    e, x, _, _ = _case(4, 4, 64, 32, 1, seed=1)
    assert not moe_prefill.takes(x.float(), e.gate_up_proj, e.down_proj)  # fp32 mode keeps the torch path
    odd = Experts(4, 48, 32).to(torch.bfloat16)  # H not a multiple of 32
    assert not moe_prefill.takes(torch.zeros(4, 48, dtype=torch.bfloat16), odd.gate_up_proj, odd.down_proj)
    with pytest.raises(moe_prefill.NativeRefused):
        moe_prefill.routed_experts(x.float(), torch.zeros(4, 1, dtype=torch.int64), torch.ones(4, 1), e.gate_up_proj,
                                   e.down_proj)  # fmt: skip
