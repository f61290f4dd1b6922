"""A Mamba2 mixer as the native step reads it (hd_mamba2.h): the tensors, and their checked place in the C layer
struct (runtime/native/hybrid_decode.py fills the rest of it)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Mamba2Weights:
    """runtime/models/layers/mamba2.py's parameters for a decode token: in_proj rows in [z | xBC | dt] order,
    xBC's channels [x (heads * head_dim) | B (groups * state) | C (groups * state)]."""

    heads: int
    head_dim: int
    state_size: int
    groups: int
    kernel: int
    in_proj: torch.Tensor  # [inner + conv_dim + heads, H]
    conv: torch.Tensor  # [conv_dim, kernel]
    neg_a: torch.Tensor  # [heads] -exp(A_log)
    dt_bias: torch.Tensor  # [heads]
    d_skip: torch.Tensor  # [heads]
    dt_limit: tuple[float, float]
    norm: torch.Tensor | None  # [inner] the grouped gated RMSNorm's weight (a group per B/C group); None: none
    out: torch.Tensor  # [H, inner]
    in_bias: torch.Tensor | None = None
    conv_bias: torch.Tensor | None = None
    out_bias: torch.Tensor | None = None

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.groups * self.state_size

    def pool_shapes(self) -> tuple[tuple[int, int], tuple[int, int, int]]:
        """A state slot's conv window and SSM state, as the torch mixer allocates them."""
        return (self.conv_dim, self.kernel - 1), (self.heads, self.head_dim, self.state_size)


Mat = Callable[[torch.Tensor | None, tuple[int, ...], str], Any]
Ptr = Callable[[torch.Tensor | None, tuple[int, ...], str], Any]


def fill_mamba2(c: ctypes.Structure, m: Mamba2Weights, hidden: int, name: str, mat: Mat, ptr: Ptr) -> None:
    """Set layer struct `c`'s Mamba2 fields from `m` through the kernel's checked converters (`mat`: a weight
    matrix read in place; `ptr`: a small fp32 vector); ValueError when the head and group counts do not divide."""
    if m.groups < 1 or m.heads % m.groups or m.kernel < 1:
        raise ValueError(f"{name}: {m.heads} Mamba2 heads in {m.groups} groups, conv kernel {m.kernel}")
    inner, conv_dim = m.inner, m.conv_dim
    width = inner + conv_dim + m.heads
    c.mh, c.mp, c.mn, c.mg, c.kernel = m.heads, m.head_dim, m.state_size, m.groups, m.kernel
    c.w_in = mat(m.in_proj, (width, hidden), f"{name} in_proj")
    c.b_in = ptr(m.in_bias, (width,), f"{name} in_proj bias")
    c.conv_w = ptr(m.conv, (conv_dim, m.kernel), f"{name} conv weight")
    c.conv_b = ptr(m.conv_bias, (conv_dim,), f"{name} conv bias")
    c.neg_a = ptr(m.neg_a, (m.heads,), f"{name} decay rate")
    c.dt_bias = ptr(m.dt_bias, (m.heads,), f"{name} dt_bias")
    c.d_skip = ptr(m.d_skip, (m.heads,), f"{name} D")
    c.dt_min, c.dt_max = float(m.dt_limit[0]), float(m.dt_limit[1])
    c.gnorm_w = ptr(m.norm, (inner,), f"{name} gated norm")
    c.w_out = mat(m.out, (hidden, inner), f"{name} out_proj")
    c.b_out = ptr(m.out_bias, (hidden,), f"{name} out_proj bias")
