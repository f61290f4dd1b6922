"""Pool buffer allocation from a model layout."""

from __future__ import annotations

import torch

from runtime.core.batch import ModelLayout
from runtime.core.buffers import allocate_pool_buffers, pool_buffer_bytes

LAYOUT = ModelLayout(
    num_layers=8,
    attn_layer_ids=(3, 7),
    linear_layer_ids=(0, 1, 2, 4, 5, 6),
    num_kv_heads=2,
    head_dim=64,
    v_head_dim=48,
    conv_state_shape=(512, 3),
    ssm_state_shape=(8, 32, 32),
    vocab_size=4096,
)


def test_shapes_dtypes_and_zeros() -> None:
    buffers = allocate_pool_buffers(
        LAYOUT,
        100,
        5,
        kv_dtype=torch.bfloat16,
        conv_dtype=torch.bfloat16,
        ssm_dtype=torch.float32,
        device="cpu",
        zeroed=True,
    )
    assert len(buffers.k) == len(buffers.v) == 2 and len(buffers.conv) == len(buffers.ssm) == 6
    assert buffers.k[0].shape == (100, 2, 64) and buffers.v[1].shape == (100, 2, 48)
    assert buffers.conv[0].shape == (5, 512, 3) and buffers.ssm[5].shape == (5, 8, 32, 32)
    assert buffers.k[0].dtype == torch.bfloat16 and buffers.ssm[0].dtype == torch.float32
    assert all(int(t.count_nonzero()) == 0 for t in (*buffers.k, *buffers.v, *buffers.conv, *buffers.ssm))
    # Every layer owns its own memory.
    assert buffers.k[0].data_ptr() != buffers.k[1].data_ptr()


def test_bytes_match_what_is_allocated() -> None:
    kwargs = {"kv_dtype": torch.float16, "conv_dtype": torch.bfloat16, "ssm_dtype": torch.float32}
    buffers = allocate_pool_buffers(LAYOUT, 77, 3, **kwargs, device="cpu")
    actual = sum(t.numel() * t.element_size() for t in (*buffers.k, *buffers.v, *buffers.conv, *buffers.ssm))
    assert pool_buffer_bytes(LAYOUT, 77, 3, **kwargs) == actual
    # Per-slot arithmetic, written out: KV (64 + 48) * 2 heads * 2 bytes * 2 layers; state per slot per layer.
    assert pool_buffer_bytes(LAYOUT, 1, 0, **kwargs) == (64 + 48) * 2 * 2 * 2
    assert pool_buffer_bytes(LAYOUT, 0, 1, **kwargs) == 6 * (512 * 3 * 2 + 8 * 32 * 32 * 4)
