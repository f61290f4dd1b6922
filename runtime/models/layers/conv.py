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
    """x: [T, C] packed new inputs; weight: [C, K]. Returns silu(conv(x)) [T, C] and writes the new states.

    Time-major throughout ([B, K-1+Lmax, C]): the depthwise conv is K shifted multiply-adds over contiguous
    rows, with no channels-major copies in and out as F.conv1d needs them (2048 x 512 inputs, one thread:
    3.1 vs 4.8 ms; the same bits as F.conv1d). Accumulated in fp32 whatever the weights' dtype, as SGLang's
    causal_conv1d kernels do: K multiply-adds rounded to bf16 after each lose the small taps."""
    width = weight.shape[-1] - 1
    weight = weight.float()
    state = packing.initial_state(conv_pool).float()  # [B, C, K-1]
    full = torch.cat([state.transpose(1, 2), packing.pad(x).float()], dim=1)  # [B, K-1+Lmax, C]
    length = packing.max_len
    out = full[:, :length] * weight[:, 0]
    for tap in range(1, width + 1):
        out.addcmul_(full[:, tap : tap + length], weight[:, tap])
    if bias is not None:
        out += bias.float()
    # The new state is the K-1 inputs ending at each sequence's last real token.
    idx = packing.lens[:, None] + torch.arange(width, device=x.device)[None, :]  # [B, K-1]
    new_state = full.gather(1, idx[:, :, None].expand(-1, -1, full.shape[2])).transpose(1, 2)
    conv_pool[packing.state_slots] = new_state.to(conv_pool.dtype)
    if packing.checkpoints is not None:
        conv_pool[packing.checkpoints.slots] = packing.checkpoints.conv_windows(full, width).to(conv_pool.dtype)
    return packing.unpad(F.silu(out)).to(x.dtype)


def causal_conv1d_decode(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_pool: torch.Tensor,
    state_slots: torch.Tensor,
) -> torch.Tensor:
    """x: [B, C], one new input per sequence. Returns silu(conv) [B, C] and rolls each slot's state. Accumulated
    in fp32, as in `causal_conv1d_extend`."""
    state = conv_pool.index_select(0, state_slots).float()  # index_select: cheaper than pool[slots]
    window = torch.cat([state, x.float()[:, :, None]], dim=-1)
    out = (window * weight.float()).sum(-1)  # [B, C, K] * [C, K]
    if bias is not None:
        out = out + bias.float()
    conv_pool.index_copy_(0, state_slots, window[:, :, 1:].to(conv_pool.dtype))
    return F.silu(out).to(x.dtype)
