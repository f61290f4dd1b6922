"""Routed experts of a bf16 prefill: torch's sorted dispatch (Experts.forward_sparse) against the AMX kernel
(runtime/native/moe_prefill.c), interleaved in one process, thread CPU time on one thread (what the work costs, the
least distorted by a busy host). Random weights and uniform routing at a model's shapes.

    python benchmarks/moe_prefill_cost.py [--tokens 16 128 512 2048] [--experts 16] [--hidden 1024] [--inter 768]
        [--top-k 2] [--repeats 9]

Defaults: real-size Qwen3-Next-shaped experts (benchmarks/peers/.work/real-qwen3-next).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from runtime.models.layers.moe import Experts
from runtime.native import moe_prefill


def cpu_ms(fn: Callable[[], object]) -> float:
    start = time.thread_time()
    fn()
    return (time.thread_time() - start) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[16, 128, 512, 2048])
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if moe_prefill.library() is None:
        raise SystemExit("no AMX-BF16 kernel here: nothing to compare")
    gen = torch.Generator().manual_seed(0)
    experts = Experts(args.experts, args.hidden, args.inter)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.03)
    experts = experts.to(torch.bfloat16)
    print(f"experts {args.experts} x (H {args.hidden}, I {args.inter}), top-{args.top_k}, bf16, 1 thread")
    for tokens in args.tokens:
        x = torch.randn(tokens, args.hidden, generator=gen).bfloat16()
        scores = torch.softmax(torch.randn(tokens, args.experts, generator=gen), dim=-1)
        weights, ids = torch.topk(scores, args.top_k, dim=-1)
        old, new, ratio = compare(experts, x, ids, weights.bfloat16(), args.repeats)
        print(f"{tokens:5d} tokens: torch {old:7.2f} ms  AMX {new:7.2f} ms  (min)  AMX/torch {ratio:.2f} (median)")


def compare(
    experts: Experts, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, repeats: int
) -> tuple[float, float, float]:
    """(torch min ms, AMX min ms, median of the per-round AMX/torch ratios), the two run alternately."""
    runs = [
        lambda: experts.forward_sparse(x, ids, weights),
        lambda: moe_prefill.routed_experts(x, ids, weights, experts.gate_up_proj, experts.down_proj),
    ]
    times: list[list[float]] = [[], []]
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first round warms both up and is dropped
            for i, run in enumerate(runs):
                times[i].append(cpu_ms(run))
    old, new = times[0][1:], times[1][1:]
    return min(old), min(new), statistics.median(n / o for o, n in zip(old, new, strict=True))


if __name__ == "__main__":
    main()
