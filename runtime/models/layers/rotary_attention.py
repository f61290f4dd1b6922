"""The families' full-attention block: q/k/v/o projections (the checkpoint's names) over paged attention, with
the options each family adds. Qwen3-Next: per-head q/k norm and an output gate; Falcon-H1: a key multiplier;
Granite-4.0-H: a tuned score scale, RoPE optional; Nemotron-H: none of them and no RoPE. (Kimi-Linear's MLA
caches a latent instead of per-head K/V: its own block.)"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from runtime.models.layers.attention import paged_attention
from runtime.models.layers.norm import ZeroCenteredRMSNorm
from runtime.models.layers.rotary import RotaryEmbedding
from runtime.native import extend_kernels, flash_attention

if TYPE_CHECKING:
    from runtime.models.base import StepContext


@dataclass(frozen=True)
class AttentionOptions:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    bias: bool = False
    qk_norm: Callable[[int], nn.Module] | None = None  # builds the per-head norm of q and of k (head_dim → module)
    output_gate: bool = False  # q_proj emits [query | gate] per head; the output is scaled by sigmoid(gate)
    key_multiplier: float = 1.0  # keys scaled before RoPE (Falcon-H1's muP)
    scale: float | None = None  # attention score scale; None: 1/sqrt(head_dim)


class RotaryAttention(nn.Module):
    """Called with `cos_sin` None, it applies no positional encoding (Nemotron-H, Granite without RoPE)."""

    def __init__(self, o: AttentionOptions) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = o.heads, o.kv_heads, o.head_dim
        self.output_gate = o.output_gate
        self.key_multiplier = o.key_multiplier
        self.scale = o.head_dim**-0.5 if o.scale is None else o.scale
        q_out = o.heads * o.head_dim * (2 if o.output_gate else 1)
        self.q_proj = nn.Linear(o.hidden, q_out, bias=o.bias)
        self.k_proj = nn.Linear(o.hidden, o.kv_heads * o.head_dim, bias=o.bias)
        self.v_proj = nn.Linear(o.hidden, o.kv_heads * o.head_dim, bias=o.bias)
        self.o_proj = nn.Linear(o.heads * o.head_dim, o.hidden, bias=o.bias)
        self.q_norm = o.qk_norm(o.head_dim) if o.qk_norm is not None else None
        self.k_norm = o.qk_norm(o.head_dim) if o.qk_norm is not None else None

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor] | None,
        ctx: StepContext,
        ordinal: int,
    ) -> torch.Tensor:
        """x: [T, hidden]; `ordinal` indexes the KV pool buffers of attention layers."""
        tokens = x.shape[0]
        gate = None
        if self.output_gate:
            q, gate = torch.chunk(self.q_proj(x).view(tokens, self.num_heads, 2 * self.head_dim), 2, dim=-1)
        else:
            q = self.q_proj(x).view(tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        normed = self._native_norm_rope(q, k, cos_sin)
        if normed is not None:
            q, k = normed
        else:
            if self.q_norm is not None and self.k_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            if self.key_multiplier != 1.0:
                k = k * self.key_multiplier
            if cos_sin is not None:
                q, k = RotaryEmbedding.rotate(q, *cos_sin), RotaryEmbedding.rotate(k, *cos_sin)
        out = paged_attention(
            q, k, v, ctx.buffers.k[ordinal], ctx.buffers.v[ordinal], ctx.out_locs, ctx.attn, self.scale, gate
        )
        return self.o_proj(out.reshape(tokens, -1))

    def _native_norm_rope(
        self, q: torch.Tensor, k: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Qwen3-Next's fp32 q/k norm and RoPE in C, one pass each for q and k (torch: ~13 dispatched passes, ~6 ms
        of CPU a layer at 2048 tokens on the peer model, here ~1 ms); None where it does not apply (torch runs)."""
        qn, kn = self.q_norm, self.k_norm
        if not (isinstance(qn, ZeroCenteredRMSNorm) and isinstance(kn, ZeroCenteredRMSNorm)):
            return None
        if self.key_multiplier != 1.0 or q.dtype != torch.float32 or q.device.type != "cpu":
            return None
        if torch.compiler.is_compiling():
            return None
        try:
            return (
                flash_attention.norm_rope(q, qn.scale(qn.weight), qn.eps, cos_sin),
                flash_attention.norm_rope(k, kn.scale(kn.weight), kn.eps, cos_sin),
            )
        except extend_kernels.NativeRefused:
            return None
