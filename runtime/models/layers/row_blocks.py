"""Row-wise work on a long extend's activations, a block of token rows at a time.

A norm on bf16 activations widens them to fp32 and makes several passes over the result; for a 2048-token
prefill at hidden 4096 each pass is a 32 MiB tensor, which glibc maps afresh (every page faults in) and which
lives in memory, not cache. Cut into blocks of ROWS tokens the same passes stay in cache; each row's result is
the same operations on the same inputs, so only torch's vector/tail split of a loop can move it (by an ulp).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ROWS = 256


def by_row_blocks(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
    """fn(*inputs) for a row-wise fn over inputs of equal first dim, computed on blocks of ROWS rows into one
    output. Short inputs, compiled graphs and accelerators call fn once."""
    rows = inputs[0].shape[0]
    if rows <= 2 * ROWS or torch.compiler.is_compiling() or inputs[0].device.type != "cpu":
        return fn(*inputs)
    first = fn(*(t[:ROWS] for t in inputs))
    out = first.new_empty(rows, *first.shape[1:])
    out[:ROWS] = first
    for start in range(ROWS, rows, ROWS):
        out[start : start + ROWS] = fn(*(t[start : start + ROWS] for t in inputs))
    return out
