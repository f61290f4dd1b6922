"""Allocate the two pools' cache memory from a model's layout, and say how much that takes.

The buffers are `torch.empty`, never zeroed here: zeroing would touch every page of a budget-sized pool at
start-up (the 4 GiB default was resident before the first request). A page becomes resident when first written,
and nothing reads a slot before writing it: a KV slot is written by its token's forward before any gather
reads it (padding in a gather repeats a written slot), and a state slot is zeroed when a request takes it
without a cached prefix (runtime/kvcache/cache_manager.py `admit`) or overwritten by a copy.
"""

from __future__ import annotations

import math

import torch

from runtime.core.batch import ModelLayout, PoolBuffers


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def pool_buffer_bytes(
    layout: ModelLayout,
    num_token_slots: int,
    num_state_slots: int,
    *,
    kv_dtype: torch.dtype,
    conv_dtype: torch.dtype,
    ssm_dtype: torch.dtype,
) -> int:
    """Bytes `allocate_pool_buffers` will allocate for the same arguments."""
    n_attn, n_linear = len(layout.attn_layer_ids), len(layout.linear_layer_ids)
    kv = n_attn * num_token_slots * layout.num_kv_heads * (layout.head_dim + layout.v_head_dim) * _itemsize(kv_dtype)
    conv = n_linear * num_state_slots * math.prod(layout.conv_state_shape) * _itemsize(conv_dtype)
    ssm = n_linear * num_state_slots * math.prod(layout.ssm_state_shape) * _itemsize(ssm_dtype)
    return kv + conv + ssm


def allocate_pool_buffers(
    layout: ModelLayout,
    num_token_slots: int,
    num_state_slots: int,
    *,
    kv_dtype: torch.dtype = torch.float32,
    conv_dtype: torch.dtype = torch.float32,
    ssm_dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    zeroed: bool = False,
) -> PoolBuffers:
    """K/V per full-attention layer and conv/SSM state per linear layer, by slot: untouched (uninitialised), or
    zeros when `zeroed` (a caller that reads slots it never wrote, e.g. a test checking what a forward wrote)."""
    n_attn, n_linear = len(layout.attn_layer_ids), len(layout.linear_layer_ids)
    heads = layout.num_kv_heads
    buffers = PoolBuffers(
        k=[torch.empty(num_token_slots, heads, layout.head_dim, dtype=kv_dtype, device=device) for _ in range(n_attn)],
        v=[
            torch.empty(num_token_slots, heads, layout.v_head_dim, dtype=kv_dtype, device=device) for _ in range(n_attn)
        ],
        conv=[
            torch.empty(num_state_slots, *layout.conv_state_shape, dtype=conv_dtype, device=device)
            for _ in range(n_linear)
        ],
        ssm=[
            torch.empty(num_state_slots, *layout.ssm_state_shape, dtype=ssm_dtype, device=device)
            for _ in range(n_linear)
        ],
    )
    if zeroed:
        for t in (*buffers.k, *buffers.v, *buffers.conv, *buffers.ssm):
            t.zero_()
    return buffers
