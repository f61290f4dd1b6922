"""RMSNorm variants, each matching its reference implementation bit for bit in fp32.

`F.rms_norm` on the fp32 input computes exactly `x * rsqrt(mean(x²) + eps) [* w]` (checked bit for bit over
hidden sizes 16-5120) in one call instead of six Python-level ops: 11 vs 17 us per norm at decode sizes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.models.layers.derived import Derived, one_plus
from runtime.models.layers.row_blocks import by_row_blocks
from runtime.native import extend_kernels


class RMSNorm(nn.Module):
    """Plain RMSNorm: `weight * x / rms(x)`. Nemotron-H multiplies by the weight in fp32 before the downcast
    (`weight_in_fp32`); Granite multiplies after it. Same in fp32; in bf16 they differ in the last bit."""

    def __init__(self, dim: int, eps: float, *, weight_in_fp32: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight_in_fp32 = weight_in_fp32
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype == torch.float32 and self.weight.dtype == torch.float32:
            # Both variants are one rms_norm with the weight inside in fp32 (the same product, checked bit for bit)
            # and no no-op conversions.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        if dtype == torch.bfloat16 and x.device.type == "cpu" and not torch.compiler.is_compiling():
            # One C pass (widen, norm, round), as ZeroCenteredRMSNorm: torch's composite made ~6 passes over each
            # row block (real-size Nemotron-H, 2048 tokens: ~4% of the prefill's op time, prefill_cpu.py --profile).
            # Granite's weight multiplies after the rounding: the kernel's weight is 1 (exact), then one bf16 mul.
            inside = self.weight.float() if self.weight_in_fp32 else torch.ones(x.shape[-1])
            try:
                h = extend_kernels.rms_norm(x.reshape(-1, x.shape[-1]), inside, self.eps).view(x.shape)
            except extend_kernels.NativeRefused:
                pass
            else:
                return h if self.weight_in_fp32 else self.weight * h
        return by_row_blocks(self._widened, x)

    def _widened(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_in_fp32:
            return F.rms_norm(x.float(), self.weight.shape, self.weight.float(), self.eps).to(x.dtype)
        return self.weight * F.rms_norm(x.float(), self.weight.shape, None, self.eps).to(x.dtype)


class ZeroCenteredRMSNorm(nn.Module):
    """Qwen3-Next's RMSNorm: the stored weight is an offset from 1; multiplied before the downcast."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))
        # `1 + weight` in fp32, kept between forwards: an add per norm per step (21 a decode step of the peer model).
        self.scale = Derived(one_plus)

    def forward(self, x: torch.Tensor, short_extend: bool = False) -> torch.Tensor:
        """`short_extend`: x is a short extend's rows (runtime/models/layers/packing.py), normed in C when the
        kernel takes them; decode and long extends keep F.rms_norm."""
        if short_extend and x.dim() == 2 and not torch.compiler.is_compiling():
            try:
                return extend_kernels.rms_norm(x, self.scale(self.weight), self.eps)
            except extend_kernels.NativeRefused:
                pass
        if x.dtype == torch.float32:  # skips two no-op conversions (dispatched ops all the same)
            return F.rms_norm(x, self.weight.shape, self.scale(self.weight), self.eps)
        scale = self.scale(self.weight)
        if x.dtype == torch.bfloat16 and x.device.type == "cpu" and not torch.compiler.is_compiling():
            # One C pass (widen, norm, round) instead of torch's three full-size passes: real-size Qwen3-Next,
            # 2048 tokens, ~1/3 of the time (benchmarks/prefill_cpu.py --by-module).
            try:
                return extend_kernels.rms_norm(x.reshape(-1, x.shape[-1]), scale, self.eps).view(x.shape)
            except extend_kernels.NativeRefused:
                pass
        return by_row_blocks(lambda rows: F.rms_norm(rows.float(), scale.shape, scale, self.eps).type_as(rows), x)

    def add_and_norm(self, x: torch.Tensor, y: torch.Tensor | None, long_extend: bool) -> tuple[torch.Tensor, ...]:
        """(x + y, norm(x + y)); y None: (x, norm(x)). `long_extend`: fp32 rows of a long extend, added and normed
        in one C pass (residual_norm.c) where the kernel takes them; otherwise torch's ops."""
        if long_extend and x.dtype == torch.float32 and x.dim() == 2 and not torch.compiler.is_compiling():
            try:
                return extend_kernels.residual_rms_norm(x, y, self.scale(self.weight), self.eps)
            except extend_kernels.NativeRefused:
                pass
        total = x if y is None else x + y
        return total, self(total)


class GatedRMSNorm(nn.Module):
    """Norm-then-gate used on the gated DeltaNet output: `weight * norm(x) * silu(gate)`."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype == torch.float32 and gate.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # The weight inside rms_norm: the same product `norm(x) * weight` (checked bit for bit), one op less.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps) * F.silu(gate)
        return by_row_blocks(self._widened, x, gate)

    def _widened(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        h = self.weight * F.rms_norm(x.float(), self.weight.shape, None, self.eps).to(x.dtype)
        h = h * F.silu(gate.float())
        return h.to(x.dtype)


class GroupedGatedRMSNorm(nn.Module):
    """Mamba2's gated norm: gate first (`x * silu(z)`), then RMS-normalize per `group_size` channels."""

    def __init__(self, dim: int, eps: float, group_size: int) -> None:
        super().__init__()
        self.eps = eps
        self.group_size = group_size
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return by_row_blocks(self._rows, x, gate)

    def _rows(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        # x multiplied into silu(z) in place (silu's own output: an fp32 gate is the caller's tensor), then one
        # rms_norm per group: the same products as x * silu(z) and h * rsqrt(mean(h²) + eps) (see the module
        # note), 4 passes over the rows instead of 8.
        h = F.silu(gate.float()).mul_(x)
        shape = h.shape
        groups = h.reshape(*shape[:-1], shape[-1] // self.group_size, self.group_size)
        h = F.rms_norm(groups, (self.group_size,), None, self.eps)
        return self.weight * h.reshape(shape).to(x.dtype)


class FalconGatedRMSNorm(nn.Module):
    """Falcon-H1's gated norm over `n_groups` channel groups, weight applied in fp32, gate either after the
    norm (`norm_before_gate`) or before it."""

    def __init__(self, dim: int, eps: float, n_groups: int, norm_before_gate: bool) -> None:
        super().__init__()
        self.eps = eps
        self.n_groups = n_groups
        self.norm_before_gate = norm_before_gate
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return by_row_blocks(self._rows, x, gate)

    def _rows(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if not self.norm_before_gate:
            x = x * F.silu(gate.float())
        h = x.float()
        shape = h.shape
        h = h.view(*shape[:-1], self.n_groups, shape[-1] // self.n_groups)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight.view(self.n_groups, -1) * h
        h = h.view(shape)
        if self.norm_before_gate:
            h = h * F.silu(gate.float())
        return h.to(dtype)
