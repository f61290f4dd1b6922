"""A Falcon-H1 layer as the native step reads it (hd_parallel.h, HD_PARALLEL): an attention mixer and a Mamba2
mixer side by side on one normed input, the muP multipliers torch applies around them, and the gating of the
Mamba2 output; its checked place in the C layer struct (runtime/native/hybrid_decode.py fills the attention half and
the feed-forward as for any layer)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from runtime.native.mamba2_weights import Mamba2Weights, Mat, Ptr, fill_mamba2

if TYPE_CHECKING:
    from runtime.native.decode_weights import AttentionWeights

# HDLayer.gate_mode (hd_model.h): gate then RMS-normalise per group (Mamba2's), gate only, normalise then gate.
GATE_GROUP_NORM, GATE_ONLY, NORM_THEN_GATE = 0, 1, 2


@dataclass
class ParallelWeights:
    """x += mamba(h * ssm_in) * ssm_out + attention(h * attn_in) * attn_out (h the normed x), then the SwiGLU
    MLP with its gate output times mlp_gate and its output times mlp_down. `in_proj_mul`: fp32 [in_proj rows], each
    row's section multiplier (None: none); `key_mul`: the keys' multiplier before RoPE."""

    attention: AttentionWeights
    mamba: Mamba2Weights
    gate_mode: int
    attn_in: float = 1.0
    attn_out: float = 1.0
    ssm_in: float = 1.0
    ssm_out: float = 1.0
    key_mul: float = 1.0
    mlp_gate: float = 1.0
    mlp_down: float = 1.0
    in_proj_mul: torch.Tensor | None = None


def fill_parallel(c: ctypes.Structure, p: ParallelWeights, hidden: int, name: str, mat: Mat, ptr: Ptr) -> None:
    """Set layer struct `c`'s Mamba2 half and multipliers from `p` (the caller fills the attention half and the
    feed-forward); ValueError for a gating the kernel does not compute or a gated norm without its weight."""
    if p.gate_mode not in (GATE_GROUP_NORM, GATE_ONLY, NORM_THEN_GATE):
        raise ValueError(f"{name}: Mamba2 gate mode {p.gate_mode} is not one the kernel computes")
    if (p.mamba.norm is None) != (p.gate_mode == GATE_ONLY):
        raise ValueError(f"{name}: a gated norm needs its weight, and a gate alone has none")
    fill_mamba2(c, p.mamba, hidden, name, mat, ptr)
    width = p.mamba.inner + p.mamba.conv_dim + p.mamba.heads
    c.in_proj_mul = ptr(p.in_proj_mul, (width,), f"{name} in_proj multipliers")
    c.gate_mode = p.gate_mode
    c.attn_in_mul, c.attn_out_mul, c.ssm_in_mul, c.ssm_out_mul = p.attn_in, p.attn_out, p.ssm_in, p.ssm_out
    c.key_mul, c.mlp_gate_mul, c.mlp_down_mul = p.key_mul, p.mlp_gate, p.mlp_down
