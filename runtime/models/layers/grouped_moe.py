"""Expert dispatch that never reads routing back to the host: the accelerator path's MoE (runtime/core/device_path.py).

The CPU path picks experts on the host (`ids.tolist()`, per-expert counts) because there a read costs nothing and
skipping unchosen experts is the point; on a GPU each such read is a stream sync per MoE layer (two per layer of an
80B-class model at batch 1). Here the (token, slot) rows are sorted by expert and run as one grouped GEMM over
per-expert row offsets computed on the device (`torch._grouped_mm`), so the step needs no host value.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def grouped_mm_takes(x: torch.Tensor) -> bool:
    """Whether `torch._grouped_mm` runs for x's device and dtype: the CPU takes any float dtype; CUDA's kernel
    wants bf16 on sm90 or newer. Elsewhere `gathered_experts` (a copy of the chosen experts' weights) runs."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if x.device.type == "cpu":
        return True
    return (
        x.device.type == "cuda" and x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (9, 0)
    )


def grouped_experts(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    w_in: torch.Tensor,
    w_out: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """x [T, H], ids / weights [T, k], w_in [E, N, H], w_out [E, H, I]; `act` maps N to I features. Returns x's
    dtype, each token's terms weighted and summed in the promoted dtype of the outputs and `weights` (as
    `traced_experts` does)."""
    if not grouped_mm_takes(x):
        return gathered_experts(x, ids, weights, w_in, w_out, act)
    top_k = ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # expert-major; a token's slots in slot order
    # Per-expert row counts by scatter-add: torch.bincount reads the max id back on CUDA.
    counts = torch.zeros(w_in.shape[0], dtype=torch.int32, device=x.device)
    counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    token_of = order // top_k
    rows = x.index_select(0, token_of)
    grouped_mm = torch._grouped_mm  # noqa: SLF001 - torch's grouped GEMM (the public one is not in 2.13)
    h = act(grouped_mm(rows, w_in.transpose(1, 2), offs=offs))
    out_rows = grouped_mm(h, w_out.transpose(1, 2), offs=offs)
    acc = torch.promote_types(out_rows.dtype, weights.dtype)
    weighted = out_rows.to(acc) * weights.reshape(-1).index_select(0, order)[:, None].to(acc)
    return torch.zeros(x.shape, dtype=acc, device=x.device).index_add_(0, token_of, weighted).to(x.dtype)


def gathered_experts(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    w_in: torch.Tensor,
    w_out: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """The same without a grouped GEMM: each (token, slot) row against a copy of its expert's weights (bmm). Costs
    the copy (the chosen experts' weights read twice), so only where `_grouped_mm` does not run."""
    tokens, top_k = ids.shape
    flat = ids.reshape(-1)
    rows = x.repeat_interleave(top_k, dim=0)[:, None, :]  # [T*k, 1, H]
    h = torch.bmm(
        act(torch.bmm(rows, w_in.index_select(0, flat).transpose(1, 2))), w_out.index_select(0, flat).transpose(1, 2)
    )
    acc = torch.promote_types(h.dtype, weights.dtype)
    return (h[:, 0].view(tokens, top_k, -1).to(acc) * weights[..., None].to(acc)).sum(1).to(x.dtype)
