"""The native decode step built from this tree against the same step built from another git revision's
runtime/native, in ONE process on the same weights, blocks interleaved, the host's read bandwidth sampled before
every block, and each build's first logits compared (from zeroed pools of its own: they must match bit for bit
unless the change is meant to alter numerics).

On a host shared with other jobs the wall time mostly measures who else runs. Each block therefore also records the
calling thread's CPU time per step (time.thread_time: a descheduled thread accrues none), and the read bandwidth is
timed the same two ways, so the fraction of the batch-1 floor (benchmarks/peers/floor.py's active bytes over the
read bandwidth) reads in either unit. A memory-bound step still slows when others load the memory bus: trust the
ratios between builds, and compare floors only within one run.

    python benchmarks/native_build_ab.py --model DIR --base REV [--batch 1] [--threads 2] [--blocks 8] [--steps 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from native_decode_bf16 import ReadBandwidth, decode_batch  # noqa: E402 - the sibling benchmark's helpers
from peers.floor import active_weight_bytes  # noqa: E402

from runtime.core.batch import ForwardBatch, PoolBuffers  # noqa: E402
from runtime.core.buffers import allocate_pool_buffers  # noqa: E402
from runtime.core.config import EngineArgs  # noqa: E402
from runtime.engine.denormals import flush_denormals_on_this_thread  # noqa: E402
from runtime.engine.native_decode import NativeDecode  # noqa: E402
from runtime.engine.pool_setup import model_dtype  # noqa: E402
from runtime.models.loader import load_model  # noqa: E402
from runtime.native.hybrid_decode import load_library  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
KV_LEN = 100


def base_step(model: torch.nn.Module, rev: str, into: Path) -> NativeDecode:
    """A NativeDecode whose library is compiled from `rev`'s runtime/native (extracted under `into`)."""
    git = ["git", "-C", str(REPO), "archive", rev, "runtime/native"]
    archive = subprocess.run(git, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    step = NativeDecode(model)
    # The same weights and glue, the other build: another name, so build.py's load-once cache keeps both.
    step.library = load_library(f"hybrid_decode_{rev}", into / "runtime" / "native" / "hybrid_decode.c")
    step.kernel = step._rebuild()
    return step


def timed(fn: NativeDecode, fb: ForwardBatch, buffers: PoolBuffers, steps: int) -> tuple[float, float]:
    """(wall seconds, calling-thread CPU seconds) per step."""
    c0, t0 = time.thread_time(), time.perf_counter()
    for _ in range(steps):
        fn(fb, buffers)
    return (time.perf_counter() - t0) / steps, (time.thread_time() - c0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--base", required=True, help="the git revision to compare against (HEAD~1, a branch, a hash)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    flush_denormals_on_this_thread()  # as the engine thread does
    torch.set_num_threads(a.threads)
    bandwidth = ReadBandwidth(a.threads)
    model = load_model(a.model, dtype=model_dtype(EngineArgs(model_path=str(a.model), dtype="auto")))
    weights = active_weight_bytes(a.model)["active"]
    layout = model.layout()

    def pools() -> PoolBuffers:
        return allocate_pool_buffers(
            layout,
            a.batch * (KV_LEN + 1),
            a.batch,
            kv_dtype=torch.float32,
            conv_dtype=torch.float32,
            ssm_dtype=torch.float32,
            device=torch.device("cpu"),
            zeroed=True,
        )

    with tempfile.TemporaryDirectory() as tmp:
        steps = {"base": base_step(model, a.base, Path(tmp)), "tree": NativeDecode(model)}
    buffers = {name: pools() for name in steps}
    for step in steps.values():
        step.threads = a.threads
    fb = decode_batch(a.batch, KV_LEN, layout.vocab_size)
    wall: dict[str, list[float]] = {n: [] for n in steps}
    cpu: dict[str, list[float]] = {n: [] for n in steps}
    read_cpu: list[float] = []
    with torch.inference_mode():
        first = {n: step(fb, buffers[n]).clone() for n, step in steps.items()}
        for _ in range(a.blocks):
            bandwidth.sample()
            read_cpu.append(bandwidth.buf.nbytes / min(timed_read(bandwidth) for _ in range(3)))
            for name, step in steps.items():
                w, c = timed(step, fb, buffers[name], a.steps)
                wall[name].append(w)
                cpu[name].append(c)
    diff = (first["base"] - first["tree"]).abs().max().item()
    print(f"model {a.model.name}, batch {a.batch}, threads {a.threads}; load average {os.getloadavg()}")
    print(f"first logits, base vs tree: max abs difference {diff}")
    for unit, bw, per in (
        ("wall", statistics.median(bandwidth.samples), wall),
        ("thread CPU", statistics.median(read_cpu), cpu),
    ):
        floor = bw / weights  # tok/s at batch 1
        parts = [f"read {bw / 1e9:.1f} GB/s, b1 floor {floor:.1f} tok/s"]
        for name, v in per.items():
            s = statistics.median(v)
            parts.append(f"{name} {s * 1e3:.1f} ms/step ({a.batch / s / floor:.0%} of the b1 floor's rate)")
        ratio = statistics.median(b / t for b, t in zip(per["base"], per["tree"], strict=True))
        print(f"{unit}: " + " | ".join(parts) + f" | tree/base speed {ratio:.3f}x (median of per-block ratios)")


def timed_read(bandwidth: ReadBandwidth) -> float:
    c0 = time.thread_time()
    bandwidth.lib.rb_read(bandwidth.buf.data_ptr(), bandwidth.blocks, bandwidth.sink.data_ptr())
    return time.thread_time() - c0


if __name__ == "__main__":
    main()
