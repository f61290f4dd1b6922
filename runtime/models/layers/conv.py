"""Depthwise causal conv1d with a rolling state of the last `kernel - 1` inputs per sequence.

The state lives in the engine's conv pool as [slot, channels, kernel - 1] (SGLang's layout).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.models.layers.packing import SequencePacking


def causal_conv1d_extend(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_pool: torch.Tensor,
    packing: SequencePacking,
) -> torch.Tensor:
    """x: [T, C] packed new inputs; weight: [C, K]. Returns silu(conv(x)) [T, C] and writes the new states."""
    kernel = weight.shape[-1]
    state = packing.initial_state(conv_pool).to(x.dtype)  # [B, C, K-1]
    xp = packing.pad(x).transpose(1, 2)  # [B, C, Lmax]
    full = torch.cat([state, xp], dim=-1)  # [B, C, K-1+Lmax]
    out = F.conv1d(full.to(weight.dtype), weight[:, None, :], bias, groups=weight.shape[0])  # [B, C, Lmax]
    # The new state is the K-1 inputs ending at each sequence's last real token.
    idx = packing.lens[:, None] + torch.arange(kernel - 1, device=x.device)[None, :]  # [B, K-1]
    new_state = full.gather(2, idx[:, None, :].expand(-1, full.shape[1], -1))
    conv_pool[packing.state_slots] = new_state.to(conv_pool.dtype)
    if packing.checkpoints is not None:
        conv_pool[packing.checkpoints.slots] = packing.checkpoints.conv_windows(full, kernel - 1).to(conv_pool.dtype)
    out = F.silu(out).transpose(1, 2)
    return packing.unpad(out).to(x.dtype)


def causal_conv1d_decode(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_pool: torch.Tensor,
    state_slots: torch.Tensor,
) -> torch.Tensor:
    """x: [B, C], one new input per sequence. Returns silu(conv) [B, C] and rolls each slot's state."""
    state = conv_pool.index_select(0, state_slots).to(weight.dtype)  # index_select: cheaper than pool[slots]
    window = torch.cat([state, x.to(weight.dtype)[:, :, None]], dim=-1)
    out = (window * weight[None]).sum(-1)
    if bias is not None:
        out = out + bias
    conv_pool.index_copy_(0, state_slots, window[:, :, 1:].to(conv_pool.dtype))
    return F.silu(out).to(x.dtype)
