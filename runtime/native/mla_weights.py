"""Kimi-Linear's multi-head latent attention as the native step reads it (hd_mla.h): the tensors, and their checked
place in the C layer struct (runtime/native/hybrid_decode.py fills the rest of it)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from runtime.native.mamba2_weights import Mat, Ptr


@dataclass
class MLAWeights:
    """runtime/models/kimi_linear.py's KimiMLA for a decode token (no positional encoding)."""

    heads: int
    nope: int  # qk_nope_head_dim
    rope: int  # qk_rope_head_dim: the key part shared by every head, cached as is
    v_dim: int
    lora: int  # kv_lora_rank: the cached latent
    scale: float
    kv_a: torch.Tensor  # [lora + rope, H] kv_a_proj_with_mqa
    kv_norm: torch.Tensor  # [lora] kv_a_layernorm
    kv_b: torch.Tensor  # [heads * (nope + v), lora]
    k_t: torch.Tensor  # [heads, lora, nope] kv_b's key rows transposed per head (derived, kv_b's dtype)
    o: torch.Tensor  # [H, heads * v]
    norm_eps: float
    q: torch.Tensor | None = None  # [heads * (nope + rope), H] without a q LoRA
    q_a: torch.Tensor | None = None  # [q_lora, H]
    q_norm: torch.Tensor | None = None  # [q_lora]
    q_b: torch.Tensor | None = None  # [heads * (nope + rope), q_lora]
    q_a_bias: torch.Tensor | None = None
    kv_a_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None

    def pool_shapes(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """A token slot's rows in the k and v pools: the latent, and the rope key part."""
        return (1, self.lora), (1, self.rope)


def fill_mla(c: ctypes.Structure, m: MLAWeights, hidden: int, name: str, mat: Mat, ptr: Ptr) -> None:
    """Set layer struct `c`'s MLA fields from `m` through the kernel's checked converters."""
    if min(m.heads, m.nope, m.v_dim, m.lora) < 1 or m.rope < 0 or (m.q is None) == (m.q_a is None):
        raise ValueError(f"{name}: MLA dims or q projections the kernel does not handle")
    qw = m.heads * (m.nope + m.rope)
    c.nh, c.attn_scale, c.mla_eps = m.heads, float(m.scale), float(m.norm_eps)
    c.mla_nope, c.mla_rope, c.mla_v, c.mla_lora = m.nope, m.rope, m.v_dim, m.lora
    if m.q is not None:
        c.wq = mat(m.q, (qw, hidden), f"{name} q_proj")
    else:
        assert m.q_a is not None and m.q_b is not None
        q_lora = m.q_a.shape[0]
        c.mla_q_lora = q_lora
        c.mla_qa = mat(m.q_a, (q_lora, hidden), f"{name} q_a_proj")
        c.mla_qa_b = ptr(m.q_a_bias, (q_lora,), f"{name} q_a_proj bias")
        c.mla_qa_norm = ptr(m.q_norm, (q_lora,), f"{name} q_a_layernorm")
        c.mla_qb = mat(m.q_b, (qw, q_lora), f"{name} q_b_proj")
        if not c.mla_qa_norm:
            raise ValueError(f"{name}: a q LoRA without its norm")
    c.mla_kva = mat(m.kv_a, (m.lora + m.rope, hidden), f"{name} kv_a_proj_with_mqa")
    c.mla_kva_b = ptr(m.kv_a_bias, (m.lora + m.rope,), f"{name} kv_a_proj_with_mqa bias")
    c.mla_kv_norm = ptr(m.kv_norm, (m.lora,), f"{name} kv_a_layernorm")
    c.mla_kvb = mat(m.kv_b, (m.heads * (m.nope + m.v_dim), m.lora), f"{name} kv_b_proj")
    c.mla_kT = mat(m.k_t, (m.heads, m.lora, m.nope), f"{name} kv_b_proj key rows (transposed)")
    c.wo = mat(m.o, (hidden, m.heads * m.v_dim), f"{name} o_proj")
    c.bo = ptr(m.o_bias, (hidden,), f"{name} o_proj bias")
