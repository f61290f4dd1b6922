"""Paged full attention over the engine's KV token pool.

The model writes each new token's K/V at its token slot, then reads every token of the sequence back through
`kv_locs`. Index tensors are built once per forward (`AttentionMetadata`) and shared by all attention layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from runtime.core.batch import ForwardBatch
from runtime.core.device_path import upload
from runtime.native import extend_kernels, flash_attention


@dataclass
class AttentionMetadata:
    """Gather indices for one forward.

    decode: `kv_index` [B, Lmax] (padding points at the slot of the sequence's first token, masked out by
    `kv_mask` [B, 1, 1, Lmax], None when all sequences have the same length).
    extend: per sequence, the KV slots (`seq_kv`), the span of its queries in the packed batch, and its mask
    (None when there is no cached prefix, so SDPA's own causal path is used).
    `write_rows` (a compiled extend padded to its bucket, runtime/engine/compiled_extend.py): the row of the new
    tokens' K/V each out_loc gets; padded rows repeat the last real token's slot and row, so that slot gets one
    value, never a padded token's.
    """

    decode: bool
    kv_index: torch.Tensor | None = None
    kv_mask: torch.Tensor | None = None
    seq_kv: list[torch.Tensor] | None = None
    q_spans: list[tuple[int, int]] | None = None
    seq_masks: list[torch.Tensor | None] | None = None
    write_rows: torch.Tensor | None = None
    # seq_masks as additive float masks (0 / -inf) per (sequence, dtype), made at the first layer that needs one:
    # SDPA turns a bool mask into this itself, in every layer (48 queries over 2048 keys: 2.7 vs 2.0 ms a layer).
    _additive: dict[tuple[int, torch.dtype], torch.Tensor] = field(default_factory=dict, repr=False)

    def extend_mask(self, seq: int, dtype: torch.dtype) -> torch.Tensor | None:
        """Sequence `seq`'s attention mask for queries of `dtype` (None: plain causal, no cached prefix)."""
        assert self.seq_masks is not None
        mask = self.seq_masks[seq]
        if mask is None or torch.compiler.is_compiling():
            return mask
        additive = self._additive.get((seq, dtype))
        if additive is None:
            additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
            self._additive[(seq, dtype)] = additive
        return additive

    def rows_to_write(self, x: torch.Tensor) -> torch.Tensor:
        """The new tokens' K or V rows to store at out_locs (see `write_rows`)."""
        return x if self.write_rows is None else x.index_select(0, self.write_rows)

    @classmethod
    def build(cls, batch: ForwardBatch, device: torch.device) -> AttentionMetadata:
        if batch.mode == "decode":
            lens = [int(loc.numel()) for loc in batch.kv_locs]
            max_len = max(lens)
            if min(lens) == max_len:
                return cls(decode=True, kv_index=upload(torch.stack(list(batch.kv_locs)), device))
            index = torch.stack([F.pad(loc, (0, max_len - loc.numel()), value=int(loc[0])) for loc in batch.kv_locs])
            lens_t = torch.tensor(lens)
            mask = (torch.arange(max_len)[None, :] < lens_t[:, None])[:, None, None, :]
            return cls(decode=True, kv_index=upload(index, device), kv_mask=upload(mask, device))
        spans: list[tuple[int, int]] = []
        masks: list[torch.Tensor | None] = []
        start = 0
        for i, (ext, pre) in enumerate(zip(batch.extend_lens, batch.prefix_lens, strict=True)):
            if batch.kv_locs[i].numel() != pre + ext:
                # An engine bug, caught here because attention would otherwise read the wrong tokens silently.
                raise ValueError(
                    f"ForwardBatch: sequence {i} has prefix_len {pre} + extend_len {ext} tokens but "
                    f"{batch.kv_locs[i].numel()} kv_locs"
                )
            spans.append((start, ext))
            start += ext
            if pre == 0:
                masks.append(None)
            else:
                rows = torch.arange(ext, device=device)[:, None] + pre
                masks.append(torch.arange(pre + ext, device=device)[None, :] <= rows)
        return cls(decode=False, seq_kv=[upload(loc, device) for loc in batch.kv_locs], q_spans=spans, seq_masks=masks)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_locs: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [T, Hq, D]; k: [T, Hkv, D]; v: [T, Hkv, Dv] for the new tokens. Returns [T, Hq, Dv] in q's dtype, times
    sigmoid(gate [T, Hq, Dv]) when a gate is given."""
    # index_copy_: the same write as `cache[out_locs] = k` without advanced indexing's per-call setup.
    k_cache.index_copy_(0, out_locs, meta.rows_to_write(k).to(k_cache.dtype))
    v_cache.index_copy_(0, out_locs, meta.rows_to_write(v).to(v_cache.dtype))
    num_q_heads, num_kv_heads = q.shape[1], k.shape[1]
    if meta.decode:
        assert meta.kv_index is not None
        batch = q.shape[0]
        # Query heads of one KV group become the "query length" axis: no K/V repeat, one SDPA call for
        # the whole batch.
        group = num_q_heads // num_kv_heads
        qg = q.view(batch, num_kv_heads, group, q.shape[-1])
        keys = _gather_rows(k_cache, meta.kv_index).to(q.dtype).transpose(1, 2)
        values = _gather_rows(v_cache, meta.kv_index).to(q.dtype).transpose(1, 2)
        out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=meta.kv_mask, scale=scale)
        return _gated(out.reshape(batch, num_q_heads, v.shape[-1]), gate)
    assert meta.seq_kv is not None and meta.q_spans is not None and meta.seq_masks is not None
    gqa = num_q_heads != num_kv_heads
    # fp32 on the CPU: the C kernel (a 2048-token prefill of the peer model, one layer, one thread: 18.4 vs 25.0 ms
    # of CPU with the gate); bf16 keeps SDPA, whose bf16 kernel runs on AMX.
    native = q.dtype == torch.float32 == k_cache.dtype and q.device.type == "cpu" and not torch.compiler.is_compiling()
    outs = []
    for seq, (kv_slots, (start, length)) in enumerate(zip(meta.seq_kv, meta.q_spans, strict=False)):
        seq_gate = None if gate is None else gate[start : start + length]
        if native:
            done = _native_extend(q, k, v, k_cache, v_cache, kv_slots, meta, seq, (start, length), scale, seq_gate)
            if done is not None:
                outs.append(done)
                continue
        mask = meta.extend_mask(seq, q.dtype)
        qs = q[start : start + length].transpose(0, 1)[None]
        keys = _gather_rows(k_cache, kv_slots).to(q.dtype).transpose(0, 1)[None]
        values = _gather_rows(v_cache, kv_slots).to(q.dtype).transpose(0, 1)[None]
        out = F.scaled_dot_product_attention(
            qs, keys, values, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=gqa
        )
        outs.append(_gated(out[0].transpose(0, 1), seq_gate))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


def _gated(out: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    return out if gate is None else torch.sigmoid(gate).mul_(out)


def _native_extend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_slots: torch.Tensor,
    meta: AttentionMetadata,
    seq: int,
    span: tuple[int, int],
    scale: float,
    gate: torch.Tensor | None,
) -> torch.Tensor | None:
    """One sequence's extend through flash_attention.causal_attention; None when the kernel refuses it."""
    start, length = span
    assert meta.seq_masks is not None
    if meta.seq_masks[seq] is None and meta.write_rows is None:
        # No cached prefix: the sequence's keys are exactly its new rows just written (an fp32 pool stores them
        # unchanged), read in place instead of gathered back.
        keys, values = k[start : start + length], v[start : start + length]
    else:
        keys, values = _gather_rows(k_cache, kv_slots), _gather_rows(v_cache, kv_slots)
    try:
        return flash_attention.causal_attention(q[start : start + length], keys, values, scale, gate)
    except extend_kernels.NativeRefused:
        return None


def _gather_rows(cache: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """cache[index] for an index of any shape, through index_select: 4-5x less CPU than advanced indexing for
    the row gathers of a decode step (8 x 200 rows of [2, 64]: 36 us vs 191 us)."""
    return cache.index_select(0, index.reshape(-1)).view(*index.shape, *cache.shape[1:])
