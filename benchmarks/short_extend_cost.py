"""Where the short-extend C kernels pay: CPU time of one gated-DeltaNet layer (projections included) and one sparse
MoE block (router, routed and shared experts) at T new tokens, the C path against the torch path, so the
threshold in runtime/models/layers/packing.py (SHORT_EXTEND_MAX_TOKENS) is chosen by measurement.

Layers are the peer model's shapes (hidden 256; DeltaNet 2 key / 4 value heads of 64; 8 experts top-2 of 128
plus a 128-wide shared expert), randomly initialised; one sequence continuing a cached state; one intra-op thread;
denormals flushed as on the engine thread. Reported: the minimum thread CPU time over --reps calls, per path.

    python benchmarks/short_extend_cost.py [--tokens 1,8,16,32,48,64,96,128,256] [--reps 20]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import runtime  # noqa: F401 - first: its OpenMP and malloc settings only take effect before torch loads

# isort: split
import torch

from runtime.core.batch import ForwardBatch
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.models.layers.gated_deltanet import GatedDeltaNet
from runtime.models.layers.moe import SparseMoE
from runtime.models.layers.packing import SequencePacking


def _min_cpu(fn: Callable[[], object], reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return best


def _packing(tokens: int, native: bool) -> SequencePacking:
    batch = ForwardBatch(
        mode="extend",
        input_ids=torch.zeros(tokens, dtype=torch.int64),
        positions=torch.zeros(tokens, dtype=torch.int64),
        extend_lens=[tokens],
        prefix_lens=[2000],
        kv_locs=[],
        out_locs=torch.zeros(tokens, dtype=torch.int64),
        state_slots=torch.tensor([1]),
    )
    packing = SequencePacking.build(batch, torch.device("cpu"))
    if native and packing.host is None:  # past the threshold: build the plan anyway, to measure the kernel
        packing.host = ([tokens], [True], [1])
    if not native:
        packing.host = None
    return packing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,8,16,32,48,64,96,128,256")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(1)
    flush_denormals_on_this_thread()
    torch.manual_seed(0)
    gdn = GatedDeltaNet(256, 2, 4, 64, 64, 4, 1e-6)
    moe = SparseMoE(256, 8, 2, 128, 128, norm_topk_prob=True)
    with torch.no_grad():
        for p in [*gdn.parameters(), *moe.parameters()]:
            p.copy_(torch.randn_like(p) * 0.05)
    gdn.after_weights_loaded()
    conv = torch.randn(4, *gdn.conv_state_shape)
    ssm = torch.randn(4, *gdn.ssm_state_shape) * 0.1
    print(f"load average {os.getloadavg()[0]:.2f}; one thread; min CPU ms over {a.reps} calls")
    print(f"{'tokens':>6} {'DeltaNet C':>11} {'torch':>8} {'ratio':>6} {'MoE C':>8} {'torch':>8} {'ratio':>6}")
    with torch.no_grad():
        for tokens in (int(t) for t in a.tokens.split(",")):
            x = torch.randn(tokens, 256)
            row = []
            for native in (True, False):
                packing = _packing(tokens, native)  # built once per forward, shared by the layers: not timed
                packing.short_extend_plan()
                row.append(_min_cpu(lambda p=packing, x=x: gdn(x, conv, ssm, p, p.state_slots), a.reps))
            for native in (True, False):
                row.append(_min_cpu(lambda n=native, x=x: moe(x, short_extend=n), a.reps))
            c, t, mc, mt = (v * 1e3 for v in row)
            print(f"{tokens:>6} {c:>11.3f} {t:>8.3f} {t / c:>6.2f} {mc:>8.3f} {mt:>8.3f} {mt / mc:>6.2f}")


if __name__ == "__main__":
    main()
