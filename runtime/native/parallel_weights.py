"""A Falcon-H1 layer as the native step reads it (hd_parallel.h, HD_PARALLEL; decode_weights.ParallelWeights): an
attention mixer and a Mamba2 mixer side by side on one normed input, the muP multipliers torch applies around them,
and the gating of the Mamba2 output; its checked place in the C layer struct (runtime/native/hybrid_decode.py
fills the attention half and the feed-forward as for any layer)."""

from __future__ import annotations

import ctypes
import dataclasses

from runtime.native.decode_weights import GATE_GROUP_NORM, GATE_ONLY, NORM_THEN_GATE, LayerWeights, ParallelWeights
from runtime.native.mamba2_weights import Mat, Ptr, fill_mamba2

__all__ = ["GATE_GROUP_NORM", "GATE_ONLY", "NORM_THEN_GATE", "ParallelWeights", "each_mixer", "fill_parallel"]


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


def each_mixer(layers: list[LayerWeights]) -> list[LayerWeights]:
    """The layers with a parallel layer's two mixers as two layers of its ordinal (the pool checks)."""
    out: list[LayerWeights] = []
    for lw in layers:
        m = lw.mixer
        parts = (m.mamba, m.attention) if isinstance(m, ParallelWeights) else (m,)
        out.extend(dataclasses.replace(lw, mixer=part) for part in parts)
    return out
