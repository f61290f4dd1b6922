"""The compiled decode's thread chooser on the real engine while the host changes: 8 sequences decode with
--enable-torch-compile under 2 torch threads; after a quiet phase two busy loops (`python -c "while True: pass"`)
start, then stop. Prints, per phase, how many compiled steps ran on 1 and on 2 threads, the median step wall
time, and how many steps after each change the chooser's setting for the batch moved.

    python benchmarks/decode_threads_trace.py [--model DIR] [--steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest, SamplingParams
from runtime.demo_model import build_demo_model
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.engine.engine_core import EngineCore

flush_denormals_on_this_thread()  # as the server's engine thread does (runtime/engine/denormals.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model directory (default: build the demo model in a temp dir)")
    ap.add_argument("--steps", type=int, default=300, help="decode steps per phase")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    model = a.model or str(build_demo_model(Path(tempfile.mkdtemp()) / "demo"))
    core = EngineCore(EngineArgs(model_path=model, memory_budget_gib=0.3, enable_torch_compile=True))
    cd = core.runner.compiled_decode
    assert cd is not None and cd.report.enabled, "the compiled decode is off"
    params = SamplingParams(temperature=0, max_new_tokens=3 * a.steps + 50, ignore_eos=True)
    for i in range(8):
        core.scheduler.add_request(GenerateRequest(f"t{i}", [17 + i, 305, 9], params), lambda o: None)
    for _ in range(20):  # prefill and the first decode steps
        core.step()
    busy: list[subprocess.Popen[bytes]] = []
    try:
        for phase in ("quiet", "busy (2 loops)", "quiet again"):
            if phase.startswith("busy"):
                busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
            elif busy:
                for p in busy:
                    p.kill()
                    p.wait()
                busy = []
            start = cd.threads.in_use().get(8)
            moved_at = None
            used, walls = [], []
            for step in range(a.steps):
                t0 = time.perf_counter()
                core.step()
                walls.append((time.perf_counter() - t0) * 1000)
                used.append(cd.threads.last_used)
                if moved_at is None and cd.threads.in_use().get(8) != start:
                    moved_at = step + 1
            by_threads = {
                n: f"{statistics.median(w for w, u in zip(walls, used, strict=True) if u == n):.2f}"
                if n in used
                else "-"
                for n in (1, 2)
            }
            print(
                f"{phase:15s}: steps on 1 / 2 threads {used.count(1)} / {used.count(2)}, median step "
                f"{statistics.median(walls):.2f} ms (on 1: {by_threads[1]}, on 2: {by_threads[2]}), "
                f"setting {start} -> {cd.threads.in_use().get(8)}"
                + (f" (first moved after {moved_at} steps)" if moved_at else "")
            )
    finally:
        for p in busy:
            p.kill()
    print(f"switches {cd.threads.switches}")


if __name__ == "__main__":
    main()
