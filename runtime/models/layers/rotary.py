"""Rotary position embedding, optionally on only the first `rotary_dim` channels of a head (partial RoPE)."""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Default (unscaled) RoPE in the "rotate half" layout that HF checkpoints use."""

    def __init__(self, head_dim: int, rotary_dim: int, base: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.base = base
        # Not a buffer: models are built on the meta device and filled from the checkpoint, which has
        # no inv_freq.
        self._inv_freq: torch.Tensor | None = None

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        if self._inv_freq is None or self._inv_freq.device != device:
            steps = torch.arange(0, self.rotary_dim, 2, dtype=torch.float, device=device)
            self._inv_freq = 1.0 / (self.base ** (steps / self.rotary_dim))
        return self._inv_freq

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin), each [T, 1, rotary_dim], computed once per forward and shared by every attention
        layer: the head axis and the "rotate half" sign are in the tables, not redone per layer and tensor.
        The sign: the first half of sin is negated, so `rotate` multiplies the halves swapped (a roll) instead
        of building `cat(-x2, x1)`; x2 * -s is -(x2 * s) bit for bit."""
        freqs = positions.float()[:, None] * self.inv_freq(positions.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        sin = emb.sin()
        sin[:, : freqs.shape[-1]].neg_()
        return emb.cos().to(dtype)[:, None, :], sin.to(dtype)[:, None, :]

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, head_dim]; cos, sin from `cos_sin`. Rotates the first cos.shape[-1] channels and passes
        the rest through: x_rot * cos + cat(-x2, x1) * sin, the halves swapped by one roll (4 dispatched ops
        with full RoPE, 7 with partial, where it was 12)."""
        rd = cos.shape[-1]
        if rd == x.shape[-1]:
            return x * cos + torch.roll(x, rd // 2, dims=-1) * sin
        x_rot = x[..., :rd]
        out = x_rot * cos + torch.roll(x_rot, rd // 2, dims=-1) * sin
        return torch.cat((out, x[..., rd:]), dim=-1)
