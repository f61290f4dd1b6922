"""Native decode vs the torch decode on a Mamba2 hybrid (Nemotron-H), in one process, against the read floor.

Loads a Nemotron-H checkpoint (default: the harness's real-size bf16 one, benchmarks/peers/.work/real-nemotron-h,
`benchmarks/peers/run.py --size real` builds it) in the dtype the server's `--dtype auto` picks, and times at batch
1 and 8 (`--kv-len` cached tokens per sequence) the native step (runtime/engine/native_decode.py: one C call) and
the torch step (`CompiledDecode`, the compiled decode graphs the server runs when native decode is off; `--eager`:
the eager forward), both on `--threads` threads, interleaved block by block (a shared host drifts: trust the
ratios). Beside them, the host's read bandwidth (benchmarks/read_bandwidth.c via native_decode_bf16.ReadBandwidth,
sampled before every block) and the batch-1 floor: the weight bytes a step reads over it. Each step also reads and
writes every Mamba2 layer's fp32 state per sequence (printed: ~24 MB a sequence for the real model), which the
floor leaves out.

    python benchmarks/native_decode_mamba.py [--model DIR] [--dtype auto] [--threads 2] [--blocks 5] [--steps 5]
        [--kv-len 100] [--eager]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from native_decode_bf16 import ReadBandwidth, decode_batch  # noqa: E402 - the sibling benchmark's helpers

from runtime.core.batch import ForwardBatch, PoolBuffers  # noqa: E402
from runtime.core.buffers import allocate_pool_buffers  # noqa: E402
from runtime.core.config import EngineArgs  # noqa: E402
from runtime.engine.compiled_decode import CompiledDecode  # noqa: E402
from runtime.engine.denormals import flush_denormals_on_this_thread  # noqa: E402
from runtime.engine.native_decode import NativeDecode, decode_weights  # noqa: E402
from runtime.engine.pool_setup import model_dtype  # noqa: E402
from runtime.models.base import HybridModel  # noqa: E402
from runtime.models.loader import load_model  # noqa: E402
from runtime.native.hybrid_decode import Mamba2Weights, set_threads  # noqa: E402

BATCHES = (1, 8)
DEFAULT_MODEL = Path(__file__).resolve().parent / "peers" / ".work" / "real-nemotron-h"


def step_bytes(model: HybridModel) -> tuple[int, int]:
    """(weight bytes a batch-1 step reads: every matrix, one embedding row; fp32 state bytes per sequence)."""
    w = decode_weights(model)
    total, state = w.lm_head.nbytes + w.embed[0].nbytes, 0
    for lw in w.layers:
        m, f = lw.mixer, lw.ffn
        for name in ("in_proj", "out", "q", "k", "v", "o"):
            t = getattr(m, name, None)
            total += t.nbytes if isinstance(t, torch.Tensor) else 0
        if f is not None:
            total += sum(t.nbytes for t in (f.mlp_gate, f.mlp_up, f.mlp_down) if t is not None)
        if isinstance(m, Mamba2Weights):
            conv, ssm = m.pool_shapes()
            state += 4 * (conv[0] * conv[1] + ssm[0] * ssm[1] * ssm[2])
    return total, state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--kv-len", type=int, default=100)
    ap.add_argument("--dtype", default="auto", help="as the server's flag (auto: the checkpoint's, bf16 here)")
    ap.add_argument("--eager", action="store_true", help="time the eager torch forward, not the compiled graphs")
    a = ap.parse_args()
    flush_denormals_on_this_thread()  # as the engine thread does
    torch.set_num_threads(a.threads)
    print(f"load average {os.getloadavg()}; torch {torch.__version__}; threads {a.threads}")
    bandwidth = ReadBandwidth(a.threads)
    model = load_model(a.model, dtype=model_dtype(EngineArgs(model_path=str(a.model), dtype=a.dtype)))
    weights, state = step_bytes(model)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model {a.model.name}: {params / 1e9:.2f}B parameters, {next(model.parameters()).dtype}; a batch-1 step "
        f"reads {weights / 1e9:.3f} GB of weights and {state / 1e6:.1f} MB of state (read and written) a sequence"
    )
    layout = model.layout()
    buffers: PoolBuffers = allocate_pool_buffers(
        layout,
        max(BATCHES) * (a.kv_len + 1) + 1024,  # room for the compiled warm-up's own batches
        max(BATCHES),
        kv_dtype=torch.float32,
        conv_dtype=torch.float32,
        ssm_dtype=torch.float32,
        device=torch.device("cpu"),
        zeroed=True,
    )
    native = NativeDecode(model)
    native.threads = None  # set here, per call

    def run_native(fb: ForwardBatch) -> torch.Tensor:
        set_threads(native.library, a.threads)
        return native(fb, buffers)

    paths: dict[str, Callable[[ForwardBatch], torch.Tensor]] = {"native": run_native}
    if a.eager:
        paths["torch-eager"] = lambda fb: model(fb, buffers)
    else:
        compiled = CompiledDecode(model, max(BATCHES), threads=a.threads)
        t0 = time.perf_counter()
        report = compiled.warm_up(buffers)
        print(f"torch compile: {report} ({time.perf_counter() - t0:.0f} s)")
        if not report.enabled:
            raise SystemExit("the compiled decode did not build; rerun with --eager")
        paths["torch-compiled"] = lambda fb: compiled(fb, buffers)
    vocab = layout.vocab_size
    for batch in BATCHES:
        fb = decode_batch(batch, a.kv_len, vocab)
        ms: dict[str, list[float]] = {name: [] for name in paths}
        best: dict[str, float] = dict.fromkeys(paths, float("inf"))
        with torch.inference_mode():
            for fn in paths.values():
                fn(fb)  # settle
            for _ in range(a.blocks):
                bandwidth.sample()
                for name, fn in paths.items():
                    t0 = time.perf_counter()
                    for _ in range(a.steps):
                        t1 = time.perf_counter()
                        fn(fb)
                        best[name] = min(best[name], (time.perf_counter() - t1) * 1e3)
                    ms[name].append((time.perf_counter() - t0) / a.steps * 1e3)
        for label, bw, step_ms in (
            ("median", bandwidth.median(), {n: statistics.median(v) for n, v in ms.items()}),
            ("best", max(bandwidth.samples), best),
        ):
            floor = bw / weights
            parts = [f"read bandwidth {bw / 1e9:.1f} GB/s, b1 floor {floor:.1f} tok/s"]
            for name, step in step_ms.items():
                tok_s = batch * 1e3 / step
                parts.append(f"{name} {step:.1f} ms/step {tok_s:.2f} tok/s ({tok_s / floor:.0%} of floor)")
            torch_name = next(n for n in step_ms if n != "native")
            ratio = step_ms[torch_name] / step_ms["native"]
            print(f"batch {batch}, {label}: " + " | ".join(parts) + f" | native/{torch_name} speed {ratio:.2f}x")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
