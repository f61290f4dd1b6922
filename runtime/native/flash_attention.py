"""Causal fp32 attention of a long extend in C (`flash_attention.c`, in the short-extend library and its worker pool):
the new rows over their cached prefix and themselves, GQA's KV heads shared by their query heads, the output gate
applied on the way out. Refuses (`NativeRefused`) what it does not take; the caller keeps torch's SDPA then."""

from __future__ import annotations

import torch

from runtime.native.extend_kernels import NativeRefused, required_library

MAX_GROUP = 32  # query heads per KV head: a unit's rows are 32 vector lanes (flash_attention.c)


def _rows(t: torch.Tensor, name: str, shape: tuple[int, int, int], heads_packed: bool) -> None:
    """fp32 on the CPU with `shape`, channels contiguous; `heads_packed`: each token's heads back to back too."""
    if t.dtype != torch.float32 or t.device.type != "cpu":
        raise NativeRefused(f"{name}: {t.dtype} on {t.device}, the kernel takes fp32 on the CPU")
    if tuple(t.shape) != shape:
        raise NativeRefused(f"{name}: shape {tuple(t.shape)}, expected {shape}")
    if t.stride(2) != 1 or (heads_packed and t.stride(1) != shape[2]):
        raise NativeRefused(f"{name}: strides {t.stride()}, channels (and heads) must be contiguous")


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, gate: torch.Tensor | None = None
) -> torch.Tensor:
    """softmax(scale * q k^T, causal) v [* sigmoid(gate)] for q [T, Hq, D] at the last T of the N positions of
    k [N, Hkv, D] and v [N, Hkv, Dv] (query i sees keys 0 .. N - T + i); gate [T, Hq, Dv] or None. Returns a
    contiguous [T, Hq, Dv]."""
    lib = required_library()
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise NativeRefused("causal_attention: q, k, v [tokens, heads, dim] expected")
    (tokens, heads, dim), (keys, kv_heads, dim_v) = q.shape, v.shape
    if tokens < 1 or keys < tokens or kv_heads < 1 or heads % kv_heads or heads // kv_heads > MAX_GROUP:
        raise NativeRefused(f"causal_attention: {tokens} queries x {heads} heads over {keys} keys x {kv_heads}")
    if dim % 8 or dim_v % 8:
        raise NativeRefused(f"causal_attention: head dims {dim}, {dim_v} (multiples of 8 only)")
    _rows(q, "q", (tokens, heads, dim), heads_packed=False)
    _rows(k, "k", (keys, kv_heads, dim), heads_packed=True)
    _rows(v, "v", (keys, kv_heads, dim_v), heads_packed=True)
    if gate is not None:
        _rows(gate, "gate", (tokens, heads, dim_v), heads_packed=False)
    out = torch.empty(tokens, heads, dim_v)
    g_ptr, g_rs, g_hs = (gate.data_ptr(), gate.stride(0), gate.stride(1)) if gate is not None else (None, 0, 0)
    rc = lib.lib.flash_attention_fp32(
        tokens, keys, heads, kv_heads, dim, dim_v, q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0),
        v.data_ptr(), v.stride(0), g_ptr, g_rs, g_hs, scale, out.data_ptr(),
    )  # fmt: skip
    if rc != 0:
        raise NativeRefused("causal_attention: refused by the kernel")
    return out


def norm_rope(
    x: torch.Tensor, weight: torch.Tensor, eps: float, cos_sin: tuple[torch.Tensor, torch.Tensor] | None
) -> torch.Tensor:
    """RoPE(F.rms_norm(x, (D,), weight, eps)) in one pass for x [T, H, D] (channels contiguous); cos_sin: rotary.py's
    tables ([T, 1, rd] each) or None (no RoPE). Returns a contiguous [T, H, D]."""
    lib = required_library()
    if x.dim() != 3:
        raise NativeRefused("norm_rope: x [tokens, heads, dim] expected")
    tokens, heads, dim = x.shape
    _rows(x, "x", (tokens, heads, dim), heads_packed=False)
    if weight.dtype != torch.float32 or tuple(weight.shape) != (dim,) or not weight.is_contiguous():
        raise NativeRefused(f"norm_rope: weight {weight.dtype} {tuple(weight.shape)}, expected fp32 ({dim},)")
    cos_ptr = sin_ptr = None
    rd = 0
    if cos_sin is not None:
        cos, sin = cos_sin
        rd = cos.shape[-1]
        for name, table in (("cos", cos), ("sin", sin)):
            if table.dtype != torch.float32 or tuple(table.shape) != (tokens, 1, rd) or not table.is_contiguous():
                raise NativeRefused(f"norm_rope: {name} {table.dtype} {tuple(table.shape)}, not ({tokens}, 1, {rd})")
        if rd % 2 or rd > dim:
            raise NativeRefused(f"norm_rope: rotary dims {rd} of {dim}")
        cos_ptr, sin_ptr = cos.data_ptr(), sin.data_ptr()
    out = torch.empty(tokens, heads, dim)
    rc = lib.lib.norm_rope_rows(
        tokens, heads, dim, x.data_ptr(), x.stride(0), x.stride(1), weight.data_ptr(), eps, cos_ptr, sin_ptr, rd,
        out.data_ptr(),
    )  # fmt: skip
    if rc != 0:
        raise NativeRefused("norm_rope: refused by the kernel")
    return out
