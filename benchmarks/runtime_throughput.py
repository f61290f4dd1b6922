"""Engine-level speed of the bundled runtime (in-process, no HTTP): single-stream decode, 8 concurrent, cold TTFT.

Drives `EngineCore.step()` directly on the demo model (greedy, ignore_eos, random prompt ids from one seed), so
what is timed is the scheduler + model hot path and nothing else:

- single stream: one 128-token prompt, 128 new tokens; decode tok/s = (n - 1) / (finish - first token)
- 8 concurrent x 128: eight 128-token prompts submitted at once, 128 new tokens each; output tokens / wall
- cold TTFT: a fresh 2048-token prompt on an empty cache (radix cache and chunked prefill at their defaults)

Medians over --repeats. `--step-cpu B` prints the engine thread's CPU time per decode step at batch B (robust
to a busy host, unlike wall time; with 2 threads the second thread's CPU is not in it, so the wall time per step
is printed too). `--torch-compile` runs the engine with --enable-torch-compile (compiled decode). `--profile`
prints cProfile's top functions (CPU time) of a decode-only run
(8 x 128 from 8-token prompts).

    python benchmarks/runtime_throughput.py [--model DIR] [--threads 2] [--repeats 3] [--step-cpu B] [--profile]
        [--torch-compile] [--dtype auto|float32|bfloat16] [--native-decode auto|on|off] [--memory-budget-gib 0.5]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest, RequestOutput, SamplingParams
from runtime.demo_model import build_demo_model
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.engine.engine_core import EngineCore

flush_denormals_on_this_thread()  # as the server's engine thread does (runtime/engine/denormals.py)

VOCAB = 4000  # below the demo tokenizer's special tokens


def run_requests(core: EngineCore, prompts: list[list[int]], max_new: int, tag: str) -> dict[str, float]:
    """Submit all prompts at once, step until done. Returns wall, first-token and finish times, tokens."""
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    tokens = [0]

    def on_output(o: RequestOutput) -> None:
        now = time.perf_counter()
        if o.new_token_ids and o.rid not in first:
            first[o.rid] = now
        tokens[0] += len(o.new_token_ids)
        if o.finished:
            done[o.rid] = now

    params = SamplingParams(temperature=0, max_new_tokens=max_new, ignore_eos=True)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        core.scheduler.add_request(GenerateRequest(f"{tag}-{i}", p, params), on_output)
    while core.scheduler.has_work:
        core.step()
    wall = time.perf_counter() - t0
    assert len(done) == len(prompts), "a request did not finish"
    return {
        "wall": wall,
        "ttft": min(first.values()) - t0,
        "first": min(first.values()),
        "last": max(done.values()),
        "tokens": float(tokens[0]),
    }


def decode_step_cpu_ms(core: EngineCore, batch: int, prompt: Callable[[int], list[int]]) -> tuple[float, float]:
    """Medians over 5 x 20 decode steps of `batch` running requests (16-token prompts, prefilled first): this
    thread's CPU ms and wall ms per step."""
    params = SamplingParams(temperature=0, max_new_tokens=200, ignore_eos=True)
    for i in range(batch):
        core.scheduler.add_request(GenerateRequest(f"cpu-{i}", prompt(16), params), lambda o: None)
    for _ in range(10):  # prefill and the first decode steps
        core.step()
    samples = []
    walls = []
    for _ in range(5):
        t, w = time.thread_time(), time.perf_counter()
        for _ in range(20):
            core.step()
        samples.append((time.thread_time() - t) / 20 * 1000)
        walls.append((time.perf_counter() - w) / 20 * 1000)
    return statistics.median(samples), statistics.median(walls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model directory (default: build the demo model in a temp dir)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory-budget-gib", type=float, default=0.5, help="pools are zero-filled")
    ap.add_argument("--skip", nargs="*", default=[], choices=["single", "concurrent", "ttft"])
    ap.add_argument("--step-cpu", type=int, metavar="B", help="CPU ms per decode step at batch B instead")
    ap.add_argument("--profile", action="store_true", help="cProfile an 8 x 128 decode run instead")
    ap.add_argument("--torch-compile", action="store_true", help="--enable-torch-compile (compiles at start)")
    ap.add_argument("--dtype", default="auto", help="the engine's --dtype (auto: bfloat16 for a bf16 checkpoint)")
    ap.add_argument("--native-decode", default="auto", choices=("auto", "on", "off"), help="the engine's flag")
    a = ap.parse_args()
    # torch loads after `runtime` (imported above), whose __init__ sets OpenMP's wait policy as in the server.
    import torch

    torch.set_num_threads(a.threads)
    model = a.model or str(build_demo_model(Path(tempfile.mkdtemp()) / "demo"))
    rng = random.Random(0)
    t0 = time.perf_counter()
    core = EngineCore(
        EngineArgs(
            model_path=model,
            memory_budget_gib=a.memory_budget_gib,
            enable_torch_compile=a.torch_compile,
            dtype=a.dtype,
            native_decode=a.native_decode,
        )
    )
    print(f"engine start {time.perf_counter() - t0:.1f} s (torch compile {'on' if a.torch_compile else 'off'})")

    def prompt(n: int) -> list[int]:
        return [rng.randrange(VOCAB) for _ in range(n)]

    run_requests(core, [prompt(64) for _ in range(8)], 16, "warmup")  # first-call allocations, lazy inits
    if a.step_cpu:
        cpu, wall = decode_step_cpu_ms(core, a.step_cpu, prompt)
        print(f"decode step at batch {a.step_cpu}: {cpu:.2f} ms CPU (this thread), {wall:.2f} ms wall")
        return
    if a.profile:
        prof = cProfile.Profile(time.thread_time)  # CPU time of this thread: robust to a busy host
        prof.enable()
        r = run_requests(core, [prompt(8) for _ in range(8)], 128, "prof")
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
        print(f"8 x 128 (8-token prompts): {r['tokens'] / r['wall']:.1f} tok/s\n{buf.getvalue()}")
        return
    single: list[float] = []
    conc: list[float] = []
    ttfts: list[float] = []
    for rep in range(a.repeats):
        if "single" not in a.skip:
            r = run_requests(core, [prompt(128)], 128, f"single{rep}")
            single.append((r["tokens"] - 1) / (r["last"] - r["first"]))
        if "concurrent" not in a.skip:
            r = run_requests(core, [prompt(128) for _ in range(8)], 128, f"conc{rep}")
            conc.append(r["tokens"] / r["wall"])
        if "ttft" not in a.skip:
            assert core.scheduler.flush_cache()
            ttfts.append(run_requests(core, [prompt(2048)], 1, f"cold{rep}")["ttft"])
    print(f"model={model} threads={a.threads} repeats={a.repeats} (medians)")
    if single:
        print(f"single stream decode   {statistics.median(single):8.1f} tok/s")
    if conc:
        print(f"8 concurrent x 128     {statistics.median(conc):8.1f} tok/s")
    if ttfts:
        print(f"cold TTFT 2048 tokens  {statistics.median(ttfts) * 1000:8.1f} ms")
    if core.runner.compiled_decode is not None and core.runner.compiled_decode.report.enabled:
        chooser = core.runner.compiled_decode.threads
        print(
            f"compiled decode threads {chooser.describe()}: now {chooser.in_use()} by batch bucket, "
            f"{chooser.switches} switches"
        )


if __name__ == "__main__":
    main()
