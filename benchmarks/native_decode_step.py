"""The decode step, native (one C call, runtime/engine/native_decode.py) vs torch eager, in-process on the real engine.

Two measurements, each at batch 1 and 8, native and torch interleaved block by block in ONE process (a shared host
drifts; trust the ratios), one torch thread, medians over `--blocks` blocks of `--calls` calls:

- forward: `ModelRunner.forward` on a decode batch of B sequences with `--kv-len` cached tokens each (the runner's
  choice of path, the step's tensors already built);
- engine step: `EngineCore.step()` while B greedy requests decode (scheduling, the forward, sampling, emission:
  what the engine thread does per token, HTTP excluded).

Reported: process CPU ms per call (time.process_time) and wall ms, and the load average before and after.
`--threads 1,2` runs the native path once per thread count (its C pool, runtime/native/parallel.h; the engine
uses min(--num-threads, usable cores) unless RUNTIME_NATIVE_DECODE_THREADS pins it), interleaved with the others.

    python benchmarks/native_decode_step.py [--model DIR] [--blocks 7] [--calls 30] [--kv-len 100] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from runtime.core.batch import ForwardBatch
from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest, SamplingParams
from runtime.demo_model import build_demo_model
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.engine.engine_core import EngineCore
from runtime.engine.native_decode import NativeDecode
from runtime.native.hybrid_decode import set_threads

BATCHES = (1, 8)


def _decode_batch(batch: int, kv_len: int, vocab: int) -> ForwardBatch:
    """B sequences of `kv_len` tokens on disjoint KV slots (sequence i from slot i * (kv_len + 1)), state slot i."""
    stride = kv_len + 1
    kv_locs = [torch.arange(i * stride, i * stride + kv_len) for i in range(batch)]
    return ForwardBatch(
        mode="decode",
        input_ids=torch.arange(batch) % vocab,
        positions=torch.full((batch,), kv_len - 1),
        extend_lens=[1] * batch,
        prefix_lens=[kv_len - 1] * batch,
        kv_locs=kv_locs,
        out_locs=torch.tensor([int(loc[-1]) for loc in kv_locs]),
        state_slots=torch.arange(batch),
    )


def _interleaved(fns: dict[str, Callable[[], object]], blocks: int, calls: int) -> dict[str, tuple[float, float]]:
    """name -> (median CPU ms, median wall ms) per call."""
    cpu: dict[str, list[float]] = {n: [] for n in fns}
    wall: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(blocks):
        for name, fn in fns.items():
            w, c = time.perf_counter(), time.process_time()
            for _ in range(calls):
                fn()
            wall[name].append((time.perf_counter() - w) / calls * 1000)
            cpu[name].append((time.process_time() - c) / calls * 1000)
    return {n: (statistics.median(cpu[n]), statistics.median(wall[n])) for n in fns}


def _print(title: str, result: dict[str, tuple[float, float]]) -> None:
    eager = result["torch"]
    parts = [f"{name} {cpu:.3f} ms CPU ({wall:.3f} wall)" for name, (cpu, wall) in result.items()]
    first = next(iter(result.values()))
    print(f"{title}: {' | '.join(parts)} | torch/{next(iter(result))} wall {eager[1] / first[1]:.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model directory (default: build the demo model in a temp dir)")
    ap.add_argument("--blocks", type=int, default=7)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--kv-len", type=int, default=100)
    ap.add_argument("--threads", default="1", help="native thread counts to compare, e.g. 1,2")
    a = ap.parse_args()
    counts = [int(t) for t in a.threads.split(",")]
    flush_denormals_on_this_thread()  # as the engine thread does
    torch.set_num_threads(1)
    model = a.model or str(build_demo_model(Path(tempfile.mkdtemp()) / "demo"))
    print(f"load average {os.getloadavg()}; torch {torch.__version__}")
    core = EngineCore(EngineArgs(model_path=model, memory_budget_gib=0.3, max_running_requests=8))
    runner = core.runner
    native = runner.native_decode
    if native is None:
        raise SystemExit(f"native decode is off for this model: {runner.native_status}")
    vocab = core.model.layout().vocab_size

    def use(path: NativeDecode | None, threads: int = 1) -> None:
        runner.native_decode = path
        if path is not None:
            set_threads(path.library, threads)

    # The engine's own thread count is bypassed here: each measured call sets its count.
    native.threads = None

    for batch in BATCHES:
        fb = _decode_batch(batch, a.kv_len, vocab)

        def forward(path: NativeDecode | None, threads: int = 1, fb: ForwardBatch = fb) -> None:
            use(path, threads)
            runner.forward(fb)

        fns = {f"native {t}t": (lambda t=t: forward(native, t)) for t in counts} | {"torch": lambda: forward(None)}
        for fn in fns.values():
            fn()  # settle
        result = _interleaved(fns, a.blocks, a.calls)
        _print(f"forward, batch {batch}, {a.kv_len} cached tokens", result)

    for batch in BATCHES:
        params = SamplingParams(temperature=0.0, max_new_tokens=3000, ignore_eos=True)
        for i in range(batch):
            core.scheduler.add_request(GenerateRequest(f"b{batch}-{i}", [1 + i, 2, 3, 4] * 8, params), lambda o: None)
        while core.scheduler.has_work and len(core.scheduler.running) < batch:
            core.step()
        for _ in range(4):
            core.step()  # every request decoding

        def step(path: NativeDecode | None, threads: int = 1) -> None:
            use(path, threads)
            core.step()

        fns = {f"native {t}t": (lambda t=t: step(native, t)) for t in counts} | {"torch": lambda: step(None)}
        result = _interleaved(fns, a.blocks, a.calls)
        _print(f"engine step, batch {batch}", result)
        for i in range(batch):
            core.scheduler.abort(f"b{batch}-{i}")
        while core.scheduler.has_work:
            core.step()
    use(native)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
