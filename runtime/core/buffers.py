"""Allocate the two pools' cache memory from a model's layout (zeros), and say how much that takes."""

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
) -> PoolBuffers:
    """Zeroed K/V per full-attention layer and conv/SSM state per linear layer, indexed by slot."""
    n_attn, n_linear = len(layout.attn_layer_ids), len(layout.linear_layer_ids)
    heads = layout.num_kv_heads
    return PoolBuffers(
        k=[torch.zeros(num_token_slots, heads, layout.head_dim, dtype=kv_dtype, device=device) for _ in range(n_attn)],
        v=[
            torch.zeros(num_token_slots, heads, layout.v_head_dim, dtype=kv_dtype, device=device) for _ in range(n_attn)
        ],
        conv=[
            torch.zeros(num_state_slots, *layout.conv_state_shape, dtype=conv_dtype, device=device)
            for _ in range(n_linear)
        ],
        ssm=[
            torch.zeros(num_state_slots, *layout.ssm_state_shape, dtype=ssm_dtype, device=device)
            for _ in range(n_linear)
        ],
    )
