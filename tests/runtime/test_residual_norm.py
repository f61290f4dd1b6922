"""The fp32 residual add + RMSNorm kernel (runtime/native/residual_norm.c) against torch's add and F.rms_norm, and
the zero-centred norm's add_and_norm taking it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.models.layers.norm import ZeroCenteredRMSNorm
from runtime.native import extend_kernels

pytestmark = pytest.mark.skipif(extend_kernels.library() is None, reason="needs a C compiler (CI installs gcc)")


@pytest.mark.parametrize(("rows", "dim", "seed"), [(1, 16, 0), (5, 1, 1), (37, 130, 2), (300, 1024, 3)])
def test_the_sum_is_torchs_add_and_the_norm_agrees_to_fp32_rounding(rows: int, dim: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(rows, dim, generator=gen) * 3, torch.randn(rows, dim, generator=gen)
    w = torch.randn(dim, generator=gen)
    total, normed = extend_kernels.residual_rms_norm(x, y, w, 1e-6)
    assert torch.equal(total, x + y)
    want = F.rms_norm(x + y, (dim,), w, 1e-6)
    # The sum of squares goes in another order: a few ulps at most, never a different value.
    torch.testing.assert_close(normed, want, atol=1e-6, rtol=4e-6)
    alone, normed_alone = extend_kernels.residual_rms_norm(x, None, w, 1e-6)
    assert alone is x
    torch.testing.assert_close(normed_alone, F.rms_norm(x, (dim,), w, 1e-6), atol=1e-6, rtol=4e-6)


def test_any_thread_count_gives_the_same_bits() -> None:
    gen = torch.Generator().manual_seed(4)
    x, y, w = torch.randn(517, 256, generator=gen), torch.randn(517, 256, generator=gen), torch.rand(256) + 0.5
    before = extend_kernels.threads()
    try:
        extend_kernels.set_threads(1)
        one = extend_kernels.residual_rms_norm(x, y, w, 1e-6)
        extend_kernels.set_threads(3)
        many = extend_kernels.residual_rms_norm(x, y, w, 1e-6)
    finally:
        extend_kernels.set_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(one, many, strict=True))


def test_refused_tensors_take_torch_and_long_extends_take_the_kernel() -> None:
    norm = ZeroCenteredRMSNorm(64, 1e-6)
    with torch.no_grad():
        norm.weight.normal_(0, 0.1)
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(33, 64, generator=gen), torch.randn(33, 64, generator=gen)
    columns = x.t().contiguous().t()  # the same values, not row-major
    with pytest.raises(extend_kernels.NativeRefused):
        extend_kernels.residual_rms_norm(columns, y, norm.scale(norm.weight), 1e-6)
    with torch.no_grad():
        kernel = norm.add_and_norm(x, y, long_extend=True)
        refused = norm.add_and_norm(columns, y, long_extend=True)  # torch's ops
        want_refused = (columns + y, norm(columns + y))
        torch_path, want = norm.add_and_norm(x, y, long_extend=False), (x + y, norm(x + y))
    assert torch.equal(kernel[0], want[0])
    torch.testing.assert_close(kernel[1], want[1], atol=1e-6, rtol=4e-6)
    assert all(torch.equal(a, b) for a, b in zip(refused, want_refused, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(torch_path, want, strict=True))
