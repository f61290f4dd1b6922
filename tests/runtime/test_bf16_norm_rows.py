"""The bf16 RMSNorm rows kernel (runtime/native/bf16_rows.c) against torch's widen / rms_norm / narrow, and the
zero-centred norm of a bf16 model taking it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.models.layers.norm import RMSNorm, ZeroCenteredRMSNorm
from runtime.native import extend_kernels

pytestmark = pytest.mark.skipif(extend_kernels.library() is None, reason="needs a C compiler (CI installs gcc)")


@pytest.mark.parametrize(("rows", "dim", "seed"), [(1, 16, 0), (37, 128, 1), (300, 1024, 2)])
def test_bf16_rows_match_torch_to_the_last_bit_but_rare_ties(rows: int, dim: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, dim + 8, generator=gen) * 4).bfloat16()[:, 3 : 3 + dim]  # rows apart, not contiguous
    w = torch.randn(dim, generator=gen)
    want = F.rms_norm(x.float(), (dim,), w, 1e-6).bfloat16()
    got = extend_kernels.rms_norm(x, w, 1e-6)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    # The sum of squares goes in another order: a value on a rounding boundary may round the other way, one ulp.
    differ = got != want
    assert differ.float().mean() < 1e-3
    ulp = want.float().abs() * 2.0**-7
    assert ((got.float() - want.float()).abs() <= ulp + 1e-30).all()


def test_bf16_rows_give_the_same_bits_on_any_thread_count() -> None:
    x = (torch.randn(257, 512, generator=torch.Generator().manual_seed(3)) * 2).bfloat16()
    w = torch.rand(512) + 0.5
    before = extend_kernels.threads()
    try:
        extend_kernels.set_threads(1)
        one = extend_kernels.rms_norm(x, w, 1e-5)
        extend_kernels.set_threads(3)
        many = extend_kernels.rms_norm(x, w, 1e-5)
    finally:
        extend_kernels.set_threads(before)
    assert torch.equal(one, many)


def test_a_bf16_zero_centred_norm_takes_the_kernel() -> None:
    norm = ZeroCenteredRMSNorm(64, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64) * 0.1)
    norm.weight.data = norm.weight.data.bfloat16()
    x = torch.randn(5, 7, 64, generator=torch.Generator().manual_seed(4)).bfloat16()  # 3-D, as a q/k norm's heads
    got = norm(x)
    assert got.shape == x.shape and got.dtype == torch.bfloat16
    assert torch.equal(got, extend_kernels.rms_norm(x.reshape(-1, 64), norm.scale(norm.weight), 1e-6).view(x.shape))
    want = F.rms_norm(x.float(), (64,), norm.scale(norm.weight), 1e-6)
    torch.testing.assert_close(got.float(), want, atol=0, rtol=2.0**-7)


def test_a_bf16_plain_norm_takes_the_kernel_with_its_weight_in_fp32() -> None:
    norm = RMSNorm(64, 1e-5)  # Nemotron-H's: the weight multiplies in fp32, before the rounding
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64) * 0.1 + 1)
    norm.weight.data = norm.weight.data.bfloat16()
    x = torch.randn(600, 64, generator=torch.Generator().manual_seed(5)).bfloat16()  # past by_row_blocks' cut
    got = norm(x)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, extend_kernels.rms_norm(x, norm.weight.float(), 1e-5))
    want = F.rms_norm(x.float(), (64,), norm.weight.float(), 1e-5)
    torch.testing.assert_close(got.float(), want, atol=0, rtol=2.0**-7)


def test_a_bf16_granite_norm_takes_the_kernel_and_weighs_after_rounding() -> None:
    norm = RMSNorm(64, 1e-6, weight_in_fp32=False)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64) * 0.1 + 1)
    norm.weight.data = norm.weight.data.bfloat16()
    x = torch.randn(3, 9, 64, generator=torch.Generator().manual_seed(6)).bfloat16()
    got = norm(x)
    assert got.shape == x.shape and got.dtype == torch.bfloat16
    normed = extend_kernels.rms_norm(x.reshape(-1, 64), torch.ones(64), 1e-6).view(x.shape)
    assert torch.equal(got, norm.weight * normed)
    want = norm.weight * F.rms_norm(x.float(), (64,), None, 1e-6).bfloat16()
    torch.testing.assert_close(got.float(), want.float(), atol=0, rtol=2.0**-6)  # an ulp before and after the weight
