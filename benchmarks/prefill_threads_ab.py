"""Cold TTFT after a busy moment: the prefill thread chooser with host hints (runtime/engine/decode_threads.py,
host_load.py; 4x-wide token buckets) against the one before (8x-wide buckets, wall times alone), side by side.

Two engines in this process, the same model and thread count. Each bucket first runs a prefill on one thread,
then one on all of them, and keeps the faster; here both first prefills run while `--busy` spinning processes
hold cores (a busy moment of a shared host, as the peers harness's warm-up prefill can meet), then the spinners
stop and `--repeats` cold prefills run on each engine, alternating A, B, A, B, ... Prints, per engine, the median
wall TTFT, the thread counts the prefills ran on, and B / A. On a host that stays busy both should keep one
thread; on a quiet one the old chooser keeps one thread for its next EXPLORE_EVERY prefills of the bucket, the
new one takes all threads back at its second.

    python benchmarks/prefill_threads_ab.py --model DIR [--threads 2] [--tokens 2048] [--repeats 6] [--busy 2]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time

from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest, SamplingParams
from runtime.engine.decode_threads import DecodeThreadChooser
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.engine.engine_core import EngineCore
from runtime.engine.model_runner import PREFILL_THREADS_ENV

flush_denormals_on_this_thread()  # as the server's engine thread does (runtime/engine/denormals.py)

VOCAB = 4000  # below the demo tokenizer's special tokens


def cold_prefill(core: EngineCore, prompt: list[int], rid: str) -> tuple[float, int]:
    """(wall s to the first token, the thread count its prefill ran on) of one cold prefill."""
    assert core.scheduler.flush_cache()
    first: list[float] = []
    params = SamplingParams(temperature=0, max_new_tokens=1, ignore_eos=True)
    wall = time.perf_counter()
    core.scheduler.add_request(GenerateRequest(rid, prompt, params), lambda o: first.append(time.perf_counter()))
    while core.scheduler.has_work:
        core.step()
    used = core.runner.prefill_threads.last_used
    return first[0] - wall, used if used is not None else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model directory (python -m runtime.demo_model --out DIR)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--busy", type=int, default=2, help="spinning processes during the first two prefills")
    a = ap.parse_args()
    import torch  # after `runtime`, whose __init__ sets OpenMP's wait policy and malloc tuning

    torch.set_num_threads(a.threads)
    engines = {name: EngineCore(EngineArgs(model_path=a.model, memory_budget_gib=0.5)) for name in ("A", "B")}
    # A: the chooser as it was (8x-wide buckets, wall times alone); B: the runner's own.
    engines["A"].runner.prefill_threads = DecodeThreadChooser.up_to(
        torch.get_num_threads(), PREFILL_THREADS_ENV, label="Prefill", bucket_bits=3
    )
    rng = random.Random(0)

    def prompt() -> list[int]:
        return [rng.randrange(VOCAB) for _ in range(a.tokens)]

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    try:
        time.sleep(0.2 if spinners else 0)
        first = {
            name: [cold_prefill(core, prompt(), f"{name}-first{i}") for i in range(2)] for name, core in engines.items()
        }
    finally:
        for s in spinners:
            s.terminate()
            s.wait()
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in engines}
    for i in range(a.repeats):
        for name, core in engines.items() if i % 2 == 0 else reversed(engines.items()):
            runs[name].append(cold_prefill(core, prompt(), f"{name}-cold{i}"))
    print(f"model={a.model} threads={a.threads} tokens={a.tokens} busy={a.busy} repeats={a.repeats}")
    for name, r in runs.items():
        firsts = " ".join(f"{1e3 * s:.0f}ms/{n}t" for s, n in first[name])
        print(
            f"{name}: cold TTFT median {1e3 * statistics.median(s for s, _ in r):7.1f} ms"
            f"  threads per prefill {[n for _, n in r]}  (first two, busy: {firsts})"
        )
    ratio = statistics.median(s for s, _ in runs["B"]) / statistics.median(s for s, _ in runs["A"])
    print(f"B / A median cold TTFT: {ratio:.2f}")


if __name__ == "__main__":
    main()
