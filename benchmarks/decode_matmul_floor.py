"""The weight-streaming floor of a batch-1 decode step: every matmul one token makes through the model, alone.

Loads the model, takes the weight of every `nn.Linear` (lm_head included) and, per MoE layer, two experts'
stacked gate|up and down matrices (a top-2 token's), and times one compiled function (inductor's C++ wrapper,
as the compiled decode) that multiplies a single row by each of them: no attention, no recurrence, no
elementwise work. Medians of 7 x 200 calls, per thread count. Compare with a compiled decode step
(benchmarks/compiled_decode_step.py) to see how much of the step is weight bandwidth.

    python benchmarks/decode_matmul_floor.py --model DIR [--threads 1 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.models.layers.moe import Experts
from runtime.models.loader import load_model

flush_denormals_on_this_thread()  # as the server's engine thread does (runtime/engine/denormals.py)


def decode_weights(model: nn.Module) -> list[torch.Tensor]:
    """[out, in] matrices one decode token multiplies by: every Linear, and two experts per MoE layer."""
    weights = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    for m in model.modules():
        if isinstance(m, Experts):
            weights += [m.gate_up_proj[e] for e in (0, 1)] + [m.down_proj[e] for e in (0, 1)]
    return [w.detach().contiguous() for w in weights]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model directory")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    a = ap.parse_args()
    weights = decode_weights(load_model(a.model))
    widths = sorted({w.shape[1] for w in weights})
    rows = {k: torch.randn(1, k) for k in widths}
    mb = sum(w.numel() * w.element_size() for w in weights) / 1e6

    def step(rows: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        return [torch.mm(rows[w.shape[1]], w.t()) for w in weights]

    print(f"{len(weights)} matmuls, {mb:.1f} MB of weights per token")
    for threads in a.threads:
        torch.set_num_threads(threads)
        torch._dynamo.reset()  # inductor bakes the thread count into the kernels
        compiled = torch.compile(step, options={"cpp_wrapper": True})
        with torch.inference_mode():
            for _ in range(50):
                compiled(rows)
            samples = []
            for _ in range(7):
                t0 = time.perf_counter()
                for _ in range(200):
                    compiled(rows)
                samples.append((time.perf_counter() - t0) / 200 * 1e3)
        ms = statistics.median(samples)
        print(f"threads {threads}: {ms:.3f} ms per token ({mb / ms:.1f} GB/s)")


if __name__ == "__main__":
    main()
