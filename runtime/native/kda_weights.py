"""A Kimi Delta Attention mixer as the native step reads it (hd_kda.h): the tensors, and their checked place in
the C layer struct (runtime/native/hybrid_decode.py fills the rest of it)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from runtime.native.mamba2_weights import Mat, Ptr


@dataclass
class KDAWeights:
    """runtime/models/kimi_linear.py's KimiDeltaAttention for a decode token (head dim dk for keys and values)."""

    heads: int
    head_dim: int
    kernel: int
    q: torch.Tensor  # [heads * dk, H]
    k: torch.Tensor
    v: torch.Tensor
    conv: torch.Tensor  # [3 * heads * dk, kernel] the taps of q, k, v channels
    f_a: torch.Tensor  # [dk, H]
    f_b: torch.Tensor  # [heads * dk, dk]
    g_a: torch.Tensor  # [dk, H]
    g_b: torch.Tensor  # [heads * dk, dk]
    b: torch.Tensor  # [heads, H]
    neg_a: torch.Tensor  # [heads] -exp(A_log)
    dt_bias: torch.Tensor  # [heads * dk]
    norm: torch.Tensor  # [dk] o_norm's weight
    out: torch.Tensor  # [H, heads * dk]

    @property
    def dim(self) -> int:
        return self.heads * self.head_dim

    def pool_shapes(self) -> tuple[tuple[int, int], tuple[int, int, int]]:
        """A state slot's conv window (SGLang's [kernel - 1, channels] layout) and recurrent state [heads, dk, dv]."""
        return (self.kernel - 1, 3 * self.dim), (self.heads, self.head_dim, self.head_dim)


def fill_kda(c: ctypes.Structure, m: KDAWeights, hidden: int, name: str, mat: Mat, ptr: Ptr) -> None:
    """Set layer struct `c`'s KDA fields from `m` through the kernel's checked converters."""
    if m.heads < 1 or m.head_dim < 1 or m.kernel < 1:
        raise ValueError(f"{name}: {m.heads} KDA heads of {m.head_dim}, conv kernel {m.kernel}")
    dim, dk = m.dim, m.head_dim
    c.nk, c.dk, c.dv, c.kernel = m.heads, dk, dk, m.kernel
    c.kda_q = mat(m.q, (dim, hidden), f"{name} q_proj")
    c.kda_k = mat(m.k, (dim, hidden), f"{name} k_proj")
    c.kda_v = mat(m.v, (dim, hidden), f"{name} v_proj")
    c.kda_fa = mat(m.f_a, (dk, hidden), f"{name} f_a_proj")
    c.kda_fb = mat(m.f_b, (dim, dk), f"{name} f_b_proj")
    c.kda_ga = mat(m.g_a, (dk, hidden), f"{name} g_a_proj")
    c.kda_gb = mat(m.g_b, (dim, dk), f"{name} g_b_proj")
    c.kda_b = mat(m.b, (m.heads, hidden), f"{name} b_proj")
    c.conv_w = ptr(m.conv, (3 * dim, m.kernel), f"{name} conv weight")
    c.neg_a = ptr(m.neg_a, (m.heads,), f"{name} decay rate")
    c.dt_bias = ptr(m.dt_bias, (dim,), f"{name} dt_bias")
    c.gnorm_w = ptr(m.norm, (dk,), f"{name} o_norm")
    c.w_out = mat(m.out, (hidden, dim), f"{name} o_proj")
