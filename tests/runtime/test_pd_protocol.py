"""The PD transfer's header and payload: round trip, corruption and short payloads refused, layout mismatch text."""

from __future__ import annotations

import pytest
import torch

from runtime.core.batch import ModelLayout
from runtime.core.buffers import allocate_pool_buffers
from runtime.pd.protocol import MISMATCH, Staged, TransferError, layout_mismatch, pool_layout, unpack_payload

LAYOUT = ModelLayout(
    num_layers=4, attn_layer_ids=(3,), linear_layer_ids=(0, 1, 2), num_kv_heads=2, head_dim=8, v_head_dim=8,
    conv_state_shape=(12, 3), ssm_state_shape=(2, 4, 4), vocab_size=32,
)  # fmt: skip


def staged() -> Staged:
    g = torch.Generator().manual_seed(0)
    tensors = [("k.0", torch.randn(5, 2, 8, generator=g)), ("v.0", torch.randn(5, 2, 8, generator=g))]
    for i in range(3):
        tensors.append((f"conv.{i}", torch.randn(12, 3, generator=g)))
        tensors.append((f"ssm.{i}", torch.randn(2, 4, 4, generator=g).to(torch.bfloat16)))
    return Staged([1, 2, 3, 4, 5], 7, -0.5, tensors, cached_tokens=2)


def test_payload_round_trips_bit_exactly_and_corruption_is_refused() -> None:
    s = staged()
    head, payload = s.header({"any": "layout"})
    assert head["prompt_len"] == 5 and head["first_token"] == 7 and head["cached_tokens"] == 2
    out = unpack_payload(head, payload)
    assert [n for n, _ in out] == [n for n, _ in s.tensors]
    for (_, a), (_, b) in zip(out, s.tensors, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    flipped = bytearray(payload)
    flipped[100] ^= 1
    with pytest.raises(TransferError, match="checksum"):
        unpack_payload(head, bytes(flipped))
    with pytest.raises(TransferError, match="checksum"):
        unpack_payload(head, payload[:-4])


def test_layouts_compare_shapes_and_dtypes_and_the_mismatch_names_both_sizes_and_the_fix() -> None:
    fp32 = pool_layout(allocate_pool_buffers(LAYOUT, 8, 2), "qwen3_next")
    assert layout_mismatch(fp32, dict(fp32)) is None
    bf16 = pool_layout(allocate_pool_buffers(LAYOUT, 8, 2, ssm_dtype=torch.bfloat16), "qwen3_next")
    message = layout_mismatch(fp32, bf16)
    assert message is not None and message.startswith(MISMATCH)
    assert str(fp32["state_bytes_per_request"]) in message and str(bf16["state_bytes_per_request"]) in message
    assert "bfloat16" in message and "Fix:" in message and "--mamba-ssm-dtype" in message
    other_model = {**fp32, "model_type": "nemotron_h"}
    assert layout_mismatch(fp32, other_model) is not None
