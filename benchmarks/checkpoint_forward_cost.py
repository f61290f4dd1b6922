"""What in-forward state checkpoints cost one prefill forward (model only, no scheduler): a 2048-token
extend of the demo model with no checkpoints vs a checkpoint every 64 / 128 / 256 tokens
(ForwardBatch.state_checkpoints). Variants take turns in a rotating order; medians.

    python benchmarks/checkpoint_forward_cost.py [--model DIR] [--length 2048] [--repeats 7] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from runtime.core.batch import ForwardBatch
from runtime.core.buffers import allocate_pool_buffers
from runtime.models.loader import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model directory (default: build the demo model in a temp dir)")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--intervals", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model_dir = a.model
    if model_dir is None:
        from runtime.demo_model import build_demo_model

        model_dir = str(build_demo_model(Path(tempfile.mkdtemp()) / "demo"))
    model = load_model(model_dir, dtype=torch.float32)
    n = a.length
    slots_needed = 2 + n // min(a.intervals)
    buffers = allocate_pool_buffers(model.layout(), n, slots_needed)
    vocab = model.layout().vocab_size

    def forward(interval: int) -> float:
        cps = [[(t, 2 + i) for i, t in enumerate(range(interval, n, interval))]] if interval else None
        batch = ForwardBatch(
            mode="extend",
            input_ids=torch.randint(0, vocab, (n,)),
            positions=torch.arange(n),
            extend_lens=[n],
            prefix_lens=[0],
            kv_locs=[torch.arange(n)],
            out_locs=torch.arange(n),
            state_slots=torch.tensor([1]),
            state_checkpoints=cps,
        )
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.forward(batch, buffers)
        return time.perf_counter() - t0

    variants = [0, *a.intervals]
    times: dict[int, list[float]] = {v: [] for v in variants}
    forward(0)  # warm-up
    for r in range(a.repeats):
        for v in variants[r % len(variants) :] + variants[: r % len(variants)]:
            times[v].append(forward(v))
    base = statistics.median(times[0])
    print(f"model={model_dir} tokens={n} threads={a.threads} repeats={a.repeats}")
    print(f"no checkpoints:        {base * 1000:7.1f} ms")
    for v in a.intervals:
        t = statistics.median(times[v])
        print(f"every {v:4d} ({n // v - (n % v == 0):3d} states): {t * 1000:7.1f} ms ({t / base:.3f}x)")


if __name__ == "__main__":
    main()
