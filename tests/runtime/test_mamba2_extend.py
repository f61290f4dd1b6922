"""The Mamba2 extend kernels in C (runtime/models/layers/mamba2_extend.py) against the torch forms (conv.py,
norm.py): the same output up to the C exp's last bits, the same new state and checkpoint windows, bit for bit."""

from __future__ import annotations

import pytest
import torch

from runtime.core.batch import ForwardBatch
from runtime.models.layers import mamba2_extend
from runtime.models.layers.conv import causal_conv1d_extend
from runtime.models.layers.norm import GroupedGatedRMSNorm
from runtime.models.layers.packing import SequencePacking


def _packing(length: int, prefix: int, checkpoints: list[tuple[int, int]]) -> SequencePacking:
    batch = ForwardBatch(
        mode="extend",
        input_ids=torch.zeros(length, dtype=torch.int64),
        positions=torch.zeros(length, dtype=torch.int64),
        extend_lens=[length],
        prefix_lens=[prefix],
        kv_locs=[],
        out_locs=torch.zeros(length, dtype=torch.int64),
        state_slots=torch.tensor([1]),
        state_checkpoints=[checkpoints],
    )
    return SequencePacking.build(batch, torch.device("cpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("length", "prefix"), [(300, 5), (2, 0), (1, 7)])
def test_c_conv_matches_torch_conv(dtype: torch.dtype, length: int, prefix: int) -> None:
    if mamba2_extend._library() is None:
        pytest.skip("no C compiler")
    g = torch.Generator().manual_seed(0)
    channels, kernel, width = 40, 4, 100
    # A column range of a wider projection, as the mixer passes it (row stride 100).
    wide = torch.randn(length, width, generator=g).to(dtype)
    x = wide[:, 30 : 30 + channels]
    weight, bias = torch.randn(channels, kernel, generator=g), torch.randn(channels, generator=g)
    start_pool = torch.randn(8, channels, kernel - 1, generator=g)
    cps = [(n, 3 + i) for i, n in enumerate(sorted({1, length // 2 + 1, length}))]
    pool_c, pool_t = start_pool.clone(), start_pool.clone()
    got = mamba2_extend.mamba2_conv_extend(x, weight, bias, pool_c, _packing(length, prefix, cps))
    want = causal_conv1d_extend(x, weight, bias, pool_t, _packing(length, prefix, cps))
    assert got.dtype == dtype
    # fp32: the C exp is within ~1e-7 of torch's; bf16: that can flip one rounding (1 ulp = 2^-8 relative).
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol)
    assert torch.equal(pool_c, pool_t)
    assert not torch.equal(pool_c[1], start_pool[1])  # the state was written


def test_batches_take_the_torch_conv() -> None:
    """Two sequences are not the kernel's: the torch path runs and gives its own result exactly."""
    batch = ForwardBatch(
        mode="extend",
        input_ids=torch.zeros(5, dtype=torch.int64),
        positions=torch.zeros(5, dtype=torch.int64),
        extend_lens=[3, 2],
        prefix_lens=[0, 0],
        kv_locs=[],
        out_locs=torch.zeros(5, dtype=torch.int64),
        state_slots=torch.tensor([1, 2]),
    )
    packing = SequencePacking.build(batch, torch.device("cpu"))
    x, weight = torch.randn(5, 8), torch.randn(8, 4)
    pool_c, pool_t = torch.zeros(4, 8, 3), torch.zeros(4, 8, 3)
    got = mamba2_extend.mamba2_conv_extend(x, weight, None, pool_c, packing)
    assert torch.equal(got, causal_conv1d_extend(x, weight, None, pool_t, packing))
    assert torch.equal(pool_c, pool_t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_c_gated_norm_matches_the_module(dtype: torch.dtype) -> None:
    if mamba2_extend._library() is None:
        pytest.skip("no C compiler")
    g = torch.Generator().manual_seed(1)
    norm = GroupedGatedRMSNorm(64, 1e-5, 16).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64, generator=g))
    y = torch.randn(37, 64, generator=g).to(dtype)
    gate = (torch.randn(37, 100, generator=g) * 3).to(dtype)[:, 20:84]  # a column range, as in_proj's output gives
    got, want = mamba2_extend.gated_norm(norm, y, gate), norm(y, gate)
    assert got.dtype == dtype
    # The C exp and sum order move fp32 by ~1e-6 relative; in bf16 that can flip a rounding (2^-8 relative).
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol)
    assert (got != want).float().mean() < (0.05 if dtype == torch.bfloat16 else 1.0)


def test_c_intra_chunk_weights_match_the_torch_form() -> None:
    """ssd.py's masked exp, one pass in C: the same up to the C exp's last bits, exact zeros above the diagonal even
    where the exponent there would overflow (a decay of -200 over the chunk)."""
    if mamba2_extend._library() is None:
        pytest.skip("no C compiler")
    g = torch.Generator().manual_seed(2)
    chunks, batch, groups, per_group, length = 3, 2, 2, 3, 16
    heads = groups * per_group
    dt = torch.rand(chunks, batch, heads, length, generator=g) + 0.01
    a_cum = (dt * -torch.rand(heads, 1, generator=g) * 25).cumsum(-1)
    shifted = a_cum - dt.log()
    scores = torch.randn(chunks, batch, groups, length, length, generator=g)
    d = torch.randn(heads, generator=g)
    got = mamba2_extend.intra_chunk_weights(a_cum, shifted, scores, d)
    assert got is not None
    upper = torch.ones(length, length, dtype=torch.bool).triu(1)
    want = torch.sub(a_cum[..., :, None], shifted[..., None, :]).masked_fill_(upper, -torch.inf).exp_()
    want = want.view(chunks, batch, groups, per_group, length, length).mul_(scores[:, :, :, None])
    want.diagonal(0, -2, -1).add_(d.view(groups, per_group, 1))
    assert torch.isfinite(got).all()
    assert torch.equal(got.masked_select(upper), want.masked_select(upper))  # zeros
    bad = ~torch.isclose(got, want, rtol=1e-6, atol=1e-6)  # atol: d + a product can cancel
    assert not bad.any(), (got[bad][:5], want[bad][:5])


def test_c_relu_squared_is_torchs_bit_for_bit() -> None:
    """Relu2MLP's activation in C on bf16, in place: torch's relu_().square_() to the bit, nan, -0, subnormals and
    overflow included; a size that is not whole slices goes to torch."""
    if mamba2_extend._library() is None:
        pytest.skip("no C compiler")
    x = (torch.randn(3, 4096, generator=torch.Generator().manual_seed(3)) * 3).bfloat16()
    specials = [float("nan"), -0.0, 0.0, 1e-40, -1e-40, 1e-20, float("inf"), -float("inf"), 3e38, -3e38]
    x.view(-1)[: len(specials)] = torch.tensor(specials).bfloat16()
    want = x.clone().relu_().square_()
    got = mamba2_extend.relu_squared_(buffer := x.clone())
    assert got.data_ptr() == buffer.data_ptr()  # in place
    assert torch.equal(got.isnan(), want.isnan())  # a nan's payload bits may differ (torch makes them canonical)
    assert torch.equal(got.nan_to_num(0.5).view(torch.int16), want.nan_to_num(0.5).view(torch.int16))
    odd = x[:, :100].nan_to_num(0.5).contiguous()
    assert torch.equal(mamba2_extend.relu_squared_(odd.clone()), odd.clone().relu_().square_())
