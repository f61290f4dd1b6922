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
        """cos/sin of shape [T, rotary_dim], computed once per forward and shared by every attention layer."""
        freqs = positions.float()[:, None] * self.inv_freq(positions.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, head_dim]; rotates the first cos.shape[-1] channels and passes the rest through."""
        rd = cos.shape[-1]
        cos = cos[:, None, :]
        sin = sin[:, None, :]
        x_rot, x_pass = x[..., :rd], x[..., rd:]
        half = rd // 2
        rotated = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
        out = x_rot * cos + rotated * sin
        if x_pass.shape[-1] == 0:
            return out
        return torch.cat((out, x_pass), dim=-1)
