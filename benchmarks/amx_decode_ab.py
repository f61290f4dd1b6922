"""The native decode step on a bf16 checkpoint with its GEMMs on AMX tiles against the FMA form
(runtime/native/amx_gemm.h; runtime.native.amx.set_bf16_tiles switches the library), in ONE process, blocks
interleaved (a shared host drifts: trust the ratios), at batch 1 and 8 with `--kv-len` cached tokens a sequence.

    python benchmarks/amx_decode_ab.py --model DIR [--threads 2] [--blocks 5] [--steps 5] [--kv-len 128]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from native_decode_bf16 import decode_batch  # noqa: E402 - the sibling benchmark's helper

from runtime.core.buffers import allocate_pool_buffers  # noqa: E402
from runtime.engine.denormals import flush_denormals_on_this_thread  # noqa: E402
from runtime.engine.native_decode import NativeDecode  # noqa: E402
from runtime.models.loader import load_model  # noqa: E402
from runtime.native.amx import bf16_tiles, set_bf16_tiles  # noqa: E402
from runtime.native.hybrid_decode import set_threads  # noqa: E402

BATCHES = (1, 8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--kv-len", type=int, default=128)
    a = ap.parse_args()
    if not bf16_tiles():
        sys.exit("this host's native kernels have no AMX path: nothing to compare")
    flush_denormals_on_this_thread()  # as the engine thread does
    print(f"load average {os.getloadavg()}; threads {a.threads}")
    model = load_model(a.model, dtype=torch.bfloat16)
    layout = model.layout()
    buffers = allocate_pool_buffers(
        layout,
        max(BATCHES) * (a.kv_len + 1),
        max(BATCHES),
        kv_dtype=torch.float32,
        conv_dtype=torch.float32,
        ssm_dtype=torch.float32,
        device=torch.device("cpu"),
        zeroed=True,
    )
    native = NativeDecode(model)
    native.threads = None
    set_threads(native.library, a.threads)
    for batch in BATCHES:
        fb = decode_batch(batch, a.kv_len, layout.vocab_size)
        ms: dict[str, list[float]] = {"tiles": [], "fma": []}
        with torch.inference_mode():
            native(fb, buffers)  # settle
            for _ in range(a.blocks):
                for name in ms:
                    set_bf16_tiles(native.library, name == "tiles")
                    t0 = time.perf_counter()
                    for _ in range(a.steps):
                        native(fb, buffers)
                    ms[name].append((time.perf_counter() - t0) / a.steps * 1e3)
        med = {n: statistics.median(v) for n, v in ms.items()}
        print(
            f"batch {batch}: tiles {med['tiles']:.1f} ms/step ({batch * 1e3 / med['tiles']:.1f} tok/s), "
            f"fma {med['fma']:.1f} ms/step ({batch * 1e3 / med['fma']:.1f} tok/s), "
            f"fma/tiles {med['fma'] / med['tiles']:.2f}x"
            f"; blocks tiles {[round(v) for v in ms['tiles']]} fma {[round(v) for v in ms['fma']]}"
        )
    set_bf16_tiles(native.library, True)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
