"""Cold prefill TTFT on one thread vs the process's threads, by prompt length: where `SERIAL_FORWARD_MAX_TOKENS`
(runtime/engine/model_runner.py) should sit. In-process `EngineCore`, demo model, radix cache on, each prompt fresh.

    python benchmarks/serial_threshold.py [--model DIR] [--threads 2] [--lengths 128 256 512 1024 2048] [--repeats 7]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from pathlib import Path

from prefill_cpu import VOCAB, cold_prefill  # benchmarks/ is this script's directory

from runtime.core.config import EngineArgs
from runtime.demo_model import build_demo_model
from runtime.engine import model_runner
from runtime.engine.decode_threads import DecodeThreadChooser
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.engine.engine_core import EngineCore

flush_denormals_on_this_thread()  # as the server's engine thread does (runtime/engine/denormals.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model directory (default: build the demo model in a temp dir)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024, 2048])
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    import torch  # after `runtime`, whose import sets OpenMP's wait policy as in the server

    torch.set_num_threads(a.threads)
    model = a.model or str(build_demo_model(Path(tempfile.mkdtemp()) / "demo"))
    core = EngineCore(EngineArgs(model_path=model, memory_budget_gib=1))
    rng = random.Random(0)

    def ttft_ms(n: int) -> float:
        return cold_prefill(core, [rng.randrange(VOCAB) for _ in range(n)], f"p{rng.random()}")[0] * 1000

    ttft_ms(64)  # first-call allocations
    print(f"threads={a.threads}, median of {a.repeats} (ms): one thread vs {a.threads}")
    for n in a.lengths:
        row = []
        for bound, threads in ((1 << 30, 1), (0, a.threads)):  # every forward on one thread, then on all
            model_runner.SERIAL_FORWARD_MAX_TOKENS = bound
            chooser = {m: DecodeThreadChooser((threads,), threads) for m in ("extend", "decode")}
            core.runner.small_forward_threads = chooser
            row.append(statistics.median(ttft_ms(n) for _ in range(a.repeats)))
        print(f"{n:6d} tokens: {row[0]:8.1f} vs {row[1]:8.1f}")


if __name__ == "__main__":
    main()
