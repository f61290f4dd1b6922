"""An fp32 prefill's whole sparse MoE block (router, routed experts, sigmoid-gated shared expert): torch's ops
against the one C call (runtime/native/moe_rows.c), interleaved in one process, min over rounds. Reports wall time
and process CPU time (time.process_time: every thread's, the C pool's spinning workers included) at 1 and 2
threads. Random weights at a model's shapes.

    python benchmarks/moe_rows_cost.py [--tokens 128 512 2048 8192] [--experts 8] [--hidden 256] [--inter 128]
        [--shared 128] [--top-k 2] [--threads 1 2] [--repeats 7]

Defaults: the demo model's block (benchmarks/peers/.work/peer-model).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from runtime.models.layers import moe as moe_layer
from runtime.native import extend_kernels


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall ms, process CPU ms) of one call."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3


def torch_block(block: moe_layer.SparseMoE, x: torch.Tensor) -> torch.Tensor:
    saved = moe_layer.ROWS_MIN_TOKENS
    moe_layer.ROWS_MIN_TOKENS = 1 << 62  # the C call never qualifies: the torch ops run
    try:
        return block(x)
    finally:
        moe_layer.ROWS_MIN_TOKENS = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[128, 512, 2048, 8192])
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=128)
    ap.add_argument("--shared", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    block = moe_layer.SparseMoE(args.hidden, args.experts, args.top_k, args.inter, args.shared, norm_topk_prob=True)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    shape = f"E {args.experts} top-{args.top_k}, H {args.hidden}, I {args.inter}, shared {args.shared}"
    print(f"SparseMoE fp32 ({shape}); min over {args.repeats} interleaved rounds")
    for threads in args.threads:
        torch.set_num_threads(threads)
        extend_kernels.set_threads(threads)
        for tokens in args.tokens:
            x = torch.randn(tokens, args.hidden, generator=gen)
            with torch.inference_mode():
                diff = (torch_block(block, x) - block(x)).abs().max().item()
            (tw, tc), (cw, cc), ratio = compare(block, x, args.repeats)
            print(
                f"{threads} thr {tokens:5d} tok: torch {tw:7.2f} ms wall {tc:7.1f} ms cpu | C {cw:7.2f} ms wall "
                f"{cc:7.1f} ms cpu | C/torch wall {ratio:.2f} (median) | max |diff| {diff:.1e}"
            )


def compare(
    block: moe_layer.SparseMoE, x: torch.Tensor, repeats: int
) -> tuple[tuple[float, float], tuple[float, float], float]:
    """((torch wall, cpu), (C wall, cpu)) minima and the median of the per-round C/torch wall ratios."""
    runs = [lambda: torch_block(block, x), lambda: block(x)]
    times: list[list[tuple[float, float]]] = [[], []]
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first round warms both up (and packs the weights) and is dropped
            for i, run in enumerate(runs):
                times[i].append(timed(run))
    old, new = times[0][1:], times[1][1:]
    best = [(min(w for w, _ in t), min(c for _, c in t)) for t in (old, new)]
    return best[0], best[1], statistics.median(n[0] / o[0] for o, n in zip(old, new, strict=True))


if __name__ == "__main__":
    main()
