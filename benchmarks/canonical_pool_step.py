"""Does allocating the pools at canonical sizes (runtime/engine/pool_setup.py) cost the compiled decode anything per
step? A/B in one process: the batch-1 compiled decode (one thread) over pools allocated as planned vs the same
pools allocated at the next power of two, blocks of calls interleaved (order alternating), thread CPU time per call.

    python benchmarks/canonical_pool_step.py --model DIR --context-length 16384 --max-running-requests 8 \
        [--blocks 40 --calls 50 --kv-len 100] [--same]

Other arguments are `python -m runtime`'s sizing flags. Compiles two batch-1 graphs (one per pool shape); inductor's
cache makes a rerun cheap. Prints each side's median and min ms per call, the ratio of medians, and how much of each
side's pool tensors is resident (mincore) after the run: the rounding's extra slots are never touched.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import time
from typing import Any

_LIBC = ctypes.CDLL(None, use_errno=True)


def resident_bytes(tensors: list[Any]) -> int:
    """Bytes of the tensors' pages that are resident (mincore), page-granular."""
    page = mmap.PAGESIZE
    total = 0
    for t in tensors:
        start = t.data_ptr() // page * page
        end = t.data_ptr() + t.numel() * t.element_size()
        pages = (end - start + page - 1) // page
        vec = (ctypes.c_ubyte * pages)()
        if _LIBC.mincore(ctypes.c_void_p(start), ctypes.c_size_t(end - start), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        total += sum(v & 1 for v in vec) * page
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--kv-len", type=int, default=100)
    ap.add_argument("--same", action="store_true", help="A/A: both sides planned-size pools (the spread of the method)")
    ap.add_argument("--state-slots", type=int, help="B's state slots instead of the canonical count (experiments)")
    own, rest = ap.parse_known_args()
    import torch
    from torch._dynamo.utils import counters

    from hybridshared.flags.runtime_parser import parse_args
    from runtime.core.buffers import allocate_pool_buffers
    from runtime.core.config import engine_args
    from runtime.core.threads import intra_op_threads
    from runtime.engine.builder import build_engine
    from runtime.engine.compile_support import run_compiled
    from runtime.engine.compiled_decode import CompiledDecode, _warmup_inputs
    from runtime.engine.denormals import flush_denormals_on_this_thread
    from runtime.engine.pool_setup import canonical_slots

    flush_denormals_on_this_thread()
    # Dynamo's automatic dynamic shapes are keyed by the code's name and line, which both sides' compiled functions
    # share: the second side to compile would get a graph dynamic in the pool dims (slower). A server
    # compiles one pool shape per process; so does each side here.
    torch._dynamo.config.automatic_dynamic_shapes = False
    torch.set_num_threads(1)
    parts = build_engine(engine_args(parse_args(rest), "cpu"))  # eager: the planned pools, allocated as planned
    model, planned = parts.model, parts.pools.buffers
    b = parts.pools
    states = b.sandbox_first_slot + b.sandbox_slots
    canonical = allocate_pool_buffers(
        model.layout(),
        b.num_token_slots if own.same else canonical_slots(b.num_token_slots),
        states if own.same else own.state_slots or canonical_slots(states),
        kv_dtype=planned.k[0].dtype if planned.k else parts.dtype,
        conv_dtype=planned.conv[0].dtype,
        ssm_dtype=planned.ssm[0].dtype,
    )
    sides = {"planned": planned, "canonical": canonical}
    print({k: (v.k[0].shape[0], v.conv[0].shape[0]) for k, v in sides.items()})
    inputs = _warmup_inputs(1, own.kv_len, model.layout().vocab_size, torch.device("cpu"))
    fns = {}
    with torch.inference_mode():
        for name, buffers in sides.items():
            decode = CompiledDecode(model, 1, threads=1)
            decode._eager(*inputs, buffers)  # lazy module caches filled before tracing, as warm_up does
            misses, t0 = counters["inductor"]["fxgraph_cache_miss"], time.perf_counter()
            decode._run(*inputs, buffers, threads=1)
            print(f"{name}: compiled in {time.perf_counter() - t0:.1f} s, "
                  f"fx graph cache misses {counters['inductor']['fxgraph_cache_miss'] - misses}")  # fmt: skip
            fns[name] = (decode, buffers)
        per_call: dict[str, list[float]] = {name: [] for name in sides}
        order = list(sides)
        for block in range(own.blocks):
            for name in order if block % 2 == 0 else order[::-1]:
                decode, buffers = fns[name]
                with intra_op_threads(1):
                    c0 = time.thread_time()
                    for _ in range(own.calls):
                        run_compiled(decode._compiled[1], *inputs, buffers, skip_guards=True)
                    per_call[name].append((time.thread_time() - c0) / own.calls * 1000)
    med = {name: statistics.median(v) for name, v in per_call.items()}
    for name, v in per_call.items():
        print(f"{name}: median {med[name]:.3f} ms CPU per call, min {min(v):.3f} ({len(v)} blocks x {own.calls})")
    print(f"canonical / planned: {med['canonical'] / med['planned']:.3f}; load average {os.getloadavg()}")
    for name, buffers in sides.items():
        tensors = [*buffers.k, *buffers.v, *buffers.conv, *buffers.ssm]
        allocated = sum(t.numel() * t.element_size() for t in tensors)
        print(f"{name}: {allocated / 2**20:.1f} MiB allocated, {resident_bytes(tensors) / 2**20:.2f} MiB resident")


if __name__ == "__main__":
    main()
