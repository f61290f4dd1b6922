"""The elastic pool's one buffer: its chunk geometry, and the model's per-layer tensors as views of it.

A row holds one token's K and V of every full-attention layer; a chunk is `rows_per_chunk` rows, enough bytes
for one state slot (conv + SSM of every linear layer). The KV views index rows, the state views index chunks;
both cover the whole buffer, and runtime/kvcache/elastic_pool.py decides which one owns each chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from runtime.core.batch import ModelLayout, PoolBuffers

_ALIGN = 16  # bytes: every view starts at a multiple of any dtype's size


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclass(frozen=True)
class ElasticGeometry:
    row_bytes: int  # one token's K and V over all full-attention layers (padded)
    slot_bytes: int  # one request's state over all linear layers (padded)
    rows_per_chunk: int  # a multiple of page_size, >= slot_bytes / row_bytes
    page_size: int
    num_chunks: int

    @property
    def chunk_bytes(self) -> int:
        return self.rows_per_chunk * self.row_bytes

    @property
    def pages_per_chunk(self) -> int:
        return self.rows_per_chunk // self.page_size

    def chunk_pages(self, chunk: int) -> range:
        ppc = self.pages_per_chunk
        return range(chunk * ppc, (chunk + 1) * ppc)


def _kv_parts(layout: ModelLayout, kv_dtype: torch.dtype) -> list[tuple[int, int]]:
    """(offset in a row, bytes) of each attention layer's K then V, in PoolBuffers order."""
    k = layout.num_kv_heads * layout.head_dim * _itemsize(kv_dtype)
    v = layout.num_kv_heads * layout.v_head_dim * _itemsize(kv_dtype)
    parts, offset = [], 0
    for size in [k] * len(layout.attn_layer_ids) + [v] * len(layout.attn_layer_ids):
        parts.append((offset, size))
        offset = _align(offset + size)
    return parts


def _state_parts(
    layout: ModelLayout, conv_dtype: torch.dtype, ssm_dtype: torch.dtype
) -> list[tuple[int, int]]:
    n = len(layout.linear_layer_ids)
    conv = math.prod(layout.conv_state_shape) * _itemsize(conv_dtype)
    ssm = math.prod(layout.ssm_state_shape) * _itemsize(ssm_dtype)
    parts, offset = [], 0
    for size in [conv] * n + [ssm] * n:
        parts.append((offset, size))
        offset = _align(offset + size)
    return parts


def elastic_geometry(
    layout: ModelLayout, total_bytes: int, page_size: int, kv_dtype: torch.dtype, conv_dtype: torch.dtype,
    ssm_dtype: torch.dtype,
) -> ElasticGeometry:  # fmt: skip
    kv = _kv_parts(layout, kv_dtype)
    st = _state_parts(layout, conv_dtype, ssm_dtype)
    row_bytes = _align(kv[-1][0] + kv[-1][1]) if kv else _ALIGN
    slot_bytes = _align(st[-1][0] + st[-1][1]) if st else _ALIGN
    rows = -(-slot_bytes // row_bytes)
    rows = -(-rows // page_size) * page_size
    return ElasticGeometry(row_bytes, slot_bytes, rows, page_size, max(2, total_bytes // (rows * row_bytes)))


def allocate_elastic_buffers(
    layout: ModelLayout, geo: ElasticGeometry, kv_dtype: torch.dtype, conv_dtype: torch.dtype,
    ssm_dtype: torch.dtype, device: str | torch.device,
) -> tuple[torch.Tensor, PoolBuffers]:  # fmt: skip
    """The one backing buffer, and the model's per-layer tensors as strided views of it (KV and state)."""
    # Untouched (runtime/core/buffers.py): a chunk's pages become resident when a token or a state is written.
    backing = torch.empty(geo.num_chunks * geo.chunk_bytes, dtype=torch.uint8, device=device)
    total_rows = geo.num_chunks * geo.rows_per_chunk

    def view(
        offset: int, dtype: torch.dtype, count: int, stride_bytes: int, shape: tuple[int, ...]
    ) -> torch.Tensor:
        item = _itemsize(dtype)
        typed = backing.view(dtype)
        inner = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
        return typed.as_strided((count, *shape), (stride_bytes // item, *inner), offset // item)

    n_attn = len(layout.attn_layer_ids)
    kv_parts = _kv_parts(layout, kv_dtype)
    heads = layout.num_kv_heads
    k = [
        view(kv_parts[i][0], kv_dtype, total_rows, geo.row_bytes, (heads, layout.head_dim))
        for i in range(n_attn)
    ]
    v = [view(kv_parts[n_attn + i][0], kv_dtype, total_rows, geo.row_bytes, (heads, layout.v_head_dim))
         for i in range(n_attn)]  # fmt: skip
    n_lin = len(layout.linear_layer_ids)
    st = _state_parts(layout, conv_dtype, ssm_dtype)
    conv = [view(st[i][0], conv_dtype, geo.num_chunks, geo.chunk_bytes, tuple(layout.conv_state_shape))
            for i in range(n_lin)]  # fmt: skip
    ssm = [view(st[n_lin + i][0], ssm_dtype, geo.num_chunks, geo.chunk_bytes, tuple(layout.ssm_state_shape))
           for i in range(n_lin)]  # fmt: skip
    return backing, PoolBuffers(k=k, v=v, conv=conv, ssm=ssm)
