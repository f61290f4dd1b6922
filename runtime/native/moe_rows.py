"""An fp32 prefill's sparse MoE block in one C call (`moe_rows.c`, in the short-extend library): router, routed
experts, shared expert and each token's sum, instead of ~40 torch ops a layer.

The weights go to the kernel packed in panels of 32 output features ([K][32]; `pack_experts`), made once per model
(the caller caches them, runtime/models/layers/derived.py). Tensors are validated here before any call: a wrong
pointer in C takes the server down; anything that does not fit raises NativeRefused and the caller runs torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runtime.native.extend_kernels import NativeRefused, Router, library, required_library, routing_inputs


@dataclass(frozen=True)
class PackedExperts:
    """Experts' SwiGLU weights as moe_rows.c reads them: w_in [E, Ip/16, H, 32] (16 gate then 16 up features a
    panel), w_out [E, Hp/32, I, 32]; Ip and Hp are I and H rounded up to 16 and 32, the padding zero."""

    w_in: torch.Tensor
    w_out: torch.Tensor
    experts: int
    hidden: int
    inter: int


def pack_experts(w_in: torch.Tensor, w_out: torch.Tensor) -> PackedExperts:
    """w_in [E, 2I, H] (gate rows, then up rows), w_out [E, H, I], fp32, into the kernel's panels."""
    experts, two_inter, hidden = w_in.shape
    inter = two_inter // 2
    if w_in.dtype != torch.float32 or w_out.dtype != torch.float32 or two_inter % 2:
        raise NativeRefused("moe rows: fp32 gate/up weights [E, 2I, H] expected")
    if tuple(w_out.shape) != (experts, hidden, inter):
        raise NativeRefused(f"moe rows: down weights {tuple(w_out.shape)}, expected {(experts, hidden, inter)}")
    pad_i, pad_h = -inter % 16, -hidden % 32
    gate = F.pad(w_in[:, :inter], (0, 0, 0, pad_i)).reshape(experts, -1, 16, hidden)
    up = F.pad(w_in[:, inter:], (0, 0, 0, pad_i)).reshape(experts, -1, 16, hidden)
    packed_in = torch.cat([gate, up], dim=2).transpose(2, 3).contiguous()
    down = F.pad(w_out, (0, 0, 0, pad_h)).reshape(experts, -1, 32, inter)
    return PackedExperts(packed_in, down.transpose(2, 3).contiguous(), experts, hidden, inter)


def pack_shared(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> PackedExperts:
    """A shared expert's gate [S, H], up [S, H], down [H, S] as one packed expert."""
    return pack_experts(torch.cat([gate, up])[None], down[None])


def vectorized() -> bool:
    """Whether the kernel has its AVX-512 tiles here: without them it is slower than torch's ops (moe_rows.c), so
    the layers take it only when this holds."""
    lib = library()
    return lib is not None and bool(lib.lib.moe_rows_vectorized())


def _fits(t: torch.Tensor, name: str, shape: tuple[int, ...]) -> None:
    if t.device.type != "cpu" or t.dtype != torch.float32 or tuple(t.shape) != shape or not t.is_contiguous():
        raise NativeRefused(f"moe rows: {name} must be contiguous fp32 {shape} on the CPU")


def moe_rows(
    x: torch.Tensor,
    experts: PackedExperts,
    *,
    router: Router | None = None,
    ids: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    shared: PackedExperts | None = None,
    shared_gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [T, H] fp32 (rows contiguous). Either `router` (the kernel routes) or ids [T, K] int64 and weights
    [T, K] fp32. `shared` with `shared_gate` [H]: a shared expert added scaled by sigmoid(x . shared_gate).
    Returns [T, H] fp32: each token's routed terms in ascending expert order, then the shared term."""
    lib = required_library()
    hidden, inter, count = experts.hidden, experts.inter, experts.experts
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[1] != hidden:
        raise NativeRefused(f"moe rows: x must be fp32 [T, {hidden}] on the CPU")
    if x.stride(1) != 1:
        raise NativeRefused("moe rows: x's rows must be contiguous")
    tokens = x.shape[0]
    ip, hp = -(-inter // 16) * 16, -(-hidden // 32) * 32
    _fits(experts.w_in, "packed w_in", (count, ip // 16, hidden, 32))
    _fits(experts.w_out, "packed w_out", (count, hp // 32, inter, 32))
    top_k, ids, weights = routing_inputs(tokens, hidden, count, router, ids, weights)
    shared_inter = 0
    shared_ptrs: list[int | None] = [None, None, None]
    if shared is not None:
        if shared_gate is None or shared.experts != 1 or shared.hidden != hidden:
            raise NativeRefused("moe rows: a shared expert needs its gate vector [H]")
        _fits(shared_gate, "shared gate", (hidden,))
        shared_inter = shared.inter
        _fits(shared.w_in, "packed shared w_in", (1, -(-shared_inter // 16), hidden, 32))
        _fits(shared.w_out, "packed shared w_out", (1, hp // 32, shared_inter, 32))
        shared_ptrs = [shared.w_in.data_ptr(), shared.w_out.data_ptr(), shared_gate.data_ptr()]
    out = torch.empty(tokens, hidden, dtype=torch.float32)
    if tokens == 0:
        return out
    failed = lib.lib.moe_prefill_f32(
        tokens, hidden, inter, count, top_k, x.data_ptr(), x.stride(0),
        None if router is None else router.weight.data_ptr(), int(router is not None and router.normalize),
        ids.data_ptr(), weights.data_ptr(), experts.w_in.data_ptr(), experts.w_out.data_ptr(), shared_inter,
        *shared_ptrs, out.data_ptr(),
    )  # fmt: skip
    if failed:
        raise MemoryError("moe_prefill_f32: no scratch memory")
    return out
