"""One decode forward of the demo model, eager vs compiled (runtime/engine/compiled_decode.py), no scheduler.

Times `CompiledDecode`'s compiled function (or the same function eager) on a synthetic decode batch of B
sequences with 100 cached tokens each, 7 rounds x 30 calls, one thread. Prints median wall ms, min wall ms and
median process CPU ms per call for batch 1 and 8. Options try the knobs issue 9 asked about: guards evaluated
on every call (--no-skip-guards), inductor's `freezing`, and the generated Python wrapper instead of the shipped
C++ one (--python-wrapper).

    python benchmarks/compiled_decode_step.py [--model DIR] [--eager] [--no-skip-guards] [--freezing] [--python-wrapper]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from runtime.core.config import EngineArgs
from runtime.demo_model import build_demo_model
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.engine.engine_core import EngineCore

flush_denormals_on_this_thread()  # as the server's engine thread does (runtime/engine/denormals.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model directory (default: build the demo model in a temp dir)")
    ap.add_argument("--eager", action="store_true", help="time the same function without compiling it")
    ap.add_argument("--no-skip-guards", action="store_true", help="evaluate every dynamo guard on each call")
    ap.add_argument("--freezing", action="store_true", help="torch._inductor.config.freezing = True")
    ap.add_argument("--python-wrapper", action="store_true", help="inductor's Python wrapper (cpp_wrapper off)")
    a = ap.parse_args()
    import torch
    import torch._inductor.config as inductor_config

    from runtime.engine import compiled_decode

    inductor_config.freezing = a.freezing
    if a.python_wrapper:
        compiled_decode._INDUCTOR_OPTIONS["cpp_wrapper"] = False
    torch.set_num_threads(1)
    model = a.model or str(build_demo_model(Path(tempfile.mkdtemp()) / "demo"))
    core = EngineCore(EngineArgs(model_path=model, memory_budget_gib=0.3))
    buffers = core.pools.buffers
    decode = compiled_decode.CompiledDecode(core.model, 8)
    if not a.eager:
        t0 = time.perf_counter()
        report = decode.warm_up(buffers)
        print(f"warm-up {time.perf_counter() - t0:.1f} s: {report}")
        decode.skip_guards = not a.no_skip_guards
    fn = decode._eager if a.eager else decode._run
    vocab = core.model.layout().vocab_size
    results = []
    with torch.inference_mode():
        for batch in (1, 8):
            inputs = compiled_decode._warmup_inputs(batch, 100, vocab, torch.device("cpu"))
            walls, cpus = [], []
            for _ in range(7):
                w, c = time.perf_counter(), time.process_time()
                for _ in range(30):
                    fn(*inputs, buffers)
                walls.append((time.perf_counter() - w) / 30 * 1000)
                cpus.append((time.process_time() - c) / 30 * 1000)
            results.append(
                f"batch {batch}: {statistics.median(walls):.2f} ms wall (min {min(walls):.2f}), "
                f"{statistics.median(cpus):.2f} ms CPU"
            )
    print(" | ".join(results))


if __name__ == "__main__":
    main()
