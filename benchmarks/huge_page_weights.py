"""Native decode with the weights on transparent huge pages (the loader's default) vs on 4 KiB pages.

Loads one checkpoint twice (`load_model(..., huge_pages=True/False)`, runtime/models/weight_arena.py), then times
the native decode step (one C call per step) of each at batch 1 and 8, blocks of --steps alternating between the
two in ONE process (a shared host drifts: trust the ratios). Every step is fed the previous step's greedy tokens,
as serving does: a fixed input token would route to the same experts every step and measure cached experts, not
the stream from memory a served step makes. Reports tok/s and the fraction of the batch-1 floor (the bytes the step
reads over the read bandwidth benchmarks/read_bandwidth.c measures between blocks).

    python benchmarks/huge_page_weights.py --model benchmarks/peers/.work/real-qwen3-next [--blocks 7] [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from native_decode_bf16 import ReadBandwidth, decode_batch, step_bytes  # benchmarks/ is this script's directory

from runtime.core.buffers import allocate_pool_buffers
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.engine.native_decode import NativeDecode
from runtime.models.loader import load_model
from runtime.models.weight_arena import thp_mode
from runtime.native.hybrid_decode import set_threads


def _anon_huge_mib() -> float:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True, help="a Qwen3-Next-family checkpoint (native decode)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--kv-len", type=int, default=200)
    a = ap.parse_args()
    flush_denormals_on_this_thread()
    print(f"load average {os.getloadavg()}; THP mode {thp_mode() or 'n/a'}; threads {a.threads}")
    models = {
        "4 KiB pages": load_model(a.model, dtype=torch.bfloat16, huge_pages=False),
        "huge pages": load_model(a.model, dtype=torch.bfloat16),
    }
    arena = models["huge pages"].weight_arena
    print(f"huge-page request accepted: {arena is not None and arena.huge}; AnonHugePages {_anon_huge_mib():.0f} MiB")
    layout = models["huge pages"].layout()
    nbytes = step_bytes(models["huge pages"])
    bandwidth = ReadBandwidth(a.threads)
    for batch in (1, 8):
        steps_per_seq = a.kv_len + 1 + a.blocks * a.steps + 2
        buffers = {
            name: allocate_pool_buffers(
                layout,
                batch * steps_per_seq,
                batch,
                kv_dtype=torch.float32,
                conv_dtype=torch.float32,
                ssm_dtype=torch.float32,
                device=torch.device("cpu"),
                zeroed=True,
            )
            for name in models
        }
        natives = {}
        for name, model in models.items():
            natives[name] = NativeDecode(model)
            natives[name].threads = None
            set_threads(natives[name].library, a.threads)
        batches = {name: decode_batch(batch, a.kv_len, layout.vocab_size) for name in models}
        times: dict[str, list[float]] = {name: [] for name in models}
        with torch.inference_mode():
            for name in models:
                natives[name](batches[name], buffers[name])
            for _ in range(a.blocks):
                bandwidth.sample()
                for name, native in natives.items():
                    fb, step = batches[name], []
                    for _ in range(a.steps):
                        t0 = time.perf_counter()
                        logits = native(fb, buffers[name])
                        step.append(time.perf_counter() - t0)
                        fb.input_ids = logits.argmax(-1)
                    times[name].append(statistics.median(step))
        floor = bandwidth.median() / nbytes
        print(f"batch {batch}: read bandwidth {bandwidth.median() / 1e9:.1f} GB/s, batch-1 floor {floor:.1f} tok/s")
        base = statistics.median(times["4 KiB pages"])
        for name, block in times.items():
            t = statistics.median(block)
            print(
                f"  {name:12s} {batch / t:7.1f} tok/s  ({100 / (t * floor):.0f}% of the floor per step; "
                f"x{base / t:.2f} vs 4 KiB)  blocks: {[round(batch / b, 1) for b in block]}"
            )


if __name__ == "__main__":
    main()
