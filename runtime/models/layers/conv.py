"""Depthwise causal conv1d with a rolling state of the last `kernel - 1` inputs per sequence.

The state lives in the engine's conv pool as [slot, channels, kernel - 1] (SGLang's layout).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.models.layers.packing import SequencePacking

# Time steps per block of the extend: its fp32 intermediates (a 64 x 6144 x 4 B window at Nemotron-H's widest,
# 1.5 MB) stay in cache and on the heap; the whole prompt's (50 MB at 2048 tokens) were fresh page-faulted
# mappings, each written and read back from memory. 2048 x 6144 bf16 inputs, one thread: 146 ms whole, 54 ms in
# blocks of 256, 45 ms in blocks of 64 (no better below).
BLOCK_STEPS = 64


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
    causal_conv1d kernels do: K multiply-adds rounded to bf16 after each lose the small taps. Computed in blocks
    of BLOCK_STEPS steps: every output element is the same operations on the same inputs whatever the blocks."""
    width = weight.shape[-1] - 1
    weight = weight.float()
    bias32 = bias.float() if bias is not None else None
    old = packing.initial_state(conv_pool).transpose(1, 2)  # [B, K-1, C] fp32: the inputs before the first new one
    inputs = packing.pad(x)  # [B, Lmax, C]
    length = packing.max_len
    out = torch.empty_like(inputs)
    for start in range(0, length, BLOCK_STEPS):
        end = min(start + BLOCK_STEPS, length)
        if start == 0:
            window = torch.cat([old, inputs[:, :end].float()], dim=1)  # [B, K-1+n, C]
        else:
            window = inputs[:, start - width : end].float()
        n = end - start
        acc = window[:, :n] * weight[:, 0]
        for tap in range(1, width + 1):
            acc.addcmul_(window[:, tap : tap + n], weight[:, tap])
        if bias32 is not None:
            acc += bias32
        out[:, start:end] = F.silu(acc)
    # The new state is the K-1 inputs ending at each sequence's last real token.
    batch = torch.arange(old.shape[0], device=x.device)
    conv_pool[packing.state_slots] = window_rows(old, inputs, batch, packing.lens).transpose(1, 2).to(conv_pool.dtype)
    cps = packing.checkpoints
    if cps is not None:
        if cps.traced_tokens is not None:  # one sequence
            seqs, tokens = torch.zeros_like(cps.traced_tokens), cps.traced_tokens
        else:
            seqs, tokens = (torch.tensor(v, device=x.device) for v in (cps.seq, cps.tokens))
        conv_pool[cps.slots] = window_rows(old, inputs, seqs, tokens).transpose(1, 2).to(conv_pool.dtype)
    return packing.unpad(out)


def window_rows(old: torch.Tensor, inputs: torch.Tensor, seqs: torch.Tensor, consumed: torch.Tensor) -> torch.Tensor:
    """[M, K-1, C] fp32: the last K-1 conv inputs of sequence seqs[m] after consumed[m] new ones, i.e. rows
    consumed .. consumed + K-2 of its old window (old: [B, K-1, C]) followed by its new inputs ([B, Lmax, C])."""
    width = old.shape[1]
    rows = consumed[:, None] + torch.arange(width, device=old.device)  # [M, K-1] into the concatenation
    seq = seqs[:, None]
    from_old = old[seq, rows.clamp(max=width - 1)]
    from_new = inputs[seq, (rows - width).clamp(min=0)].float()
    return torch.where((rows < width)[..., None], from_old, from_new)


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
