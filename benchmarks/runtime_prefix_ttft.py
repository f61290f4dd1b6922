"""Warm vs cold TTFT of the bundled runtime's state-aware prefix cache (in-process, the demo model, CPU).

Cold: a 2048-token prompt on an empty cache. Warm: prompt A = 2000-token document + question 1 runs
first; prompt B = the same document + question 2 (2048 tokens) is then timed: it resumes from the deepest
state checkpoint inside the document (every mamba_track_interval tokens), and checkpoints the branch point
(the document's end, where the tree had KV but no state). Prompt C = document + question 3 then resumes at
the document's end ("branch"). Also times the cold prompt with the cache off (one forward, no checkpoints)
to show what checkpointing costs a cold prefill; the engines take the cold prompt in a rotating order.
Run for several intervals:

    python benchmarks/runtime_prefix_ttft.py [--model DIR] [--intervals 64 128 256] [--repeats 3] [--torch-compile]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest, RequestOutput, SamplingParams
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.engine.engine_core import EngineCore

flush_denormals_on_this_thread()  # as the server's engine thread does (runtime/engine/denormals.py)


def ttft(core: EngineCore, rid: str, prompt: list[int]) -> tuple[float, int]:
    """Seconds from submission to the first output token, and the cached prompt tokens."""
    first: list[float] = []
    cached: list[int] = []

    def on_output(o: RequestOutput) -> None:
        if not first and o.new_token_ids:
            first.append(time.perf_counter())
        if o.finished:
            cached.append(o.cached_tokens)

    t0 = time.perf_counter()
    params = SamplingParams(temperature=0, max_new_tokens=1, ignore_eos=True)
    core.scheduler.add_request(GenerateRequest(rid, prompt, params), on_output)
    while core.scheduler.has_work:
        core.step()
    return first[0] - t0, cached[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model directory (default: build the demo model in a temp dir)")
    ap.add_argument("--intervals", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--doc-len", type=int, default=2000)
    ap.add_argument("--total-len", type=int, default=2048)
    ap.add_argument("--memory-budget-gib", type=float, default=0.5, help="pools are zero-filled")
    ap.add_argument(
        "--torch-compile",
        action="store_true",
        help="the cached engines run --enable-torch-compile (compiled decode and short extends)",
    )
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = a.model
    if model is None:
        from runtime.demo_model import build_demo_model

        model = str(build_demo_model(Path(tempfile.mkdtemp()) / "demo"))
    rng = random.Random(0)
    vocab = 4000
    q_len = a.total_len - a.doc_len
    print(f"model={model} doc={a.doc_len} total={a.total_len} threads={a.threads} torch_compile={a.torch_compile}")
    budget = a.memory_budget_gib
    # All engines live at once and take turns on the same prompts, so a busy host slows them alike.
    off = EngineCore(EngineArgs(model_path=model, disable_radix_cache=True, memory_budget_gib=budget))
    cores = {
        n: EngineCore(
            EngineArgs(
                model_path=model, mamba_track_interval=n, memory_budget_gib=budget, enable_torch_compile=a.torch_compile
            )
        )
        for n in a.intervals
    }
    off_times: list[float] = []
    colds: dict[int, list[float]] = {n: [] for n in a.intervals}
    warms: dict[int, list[float]] = {n: [] for n in a.intervals}
    branch: dict[int, list[float]] = {n: [] for n in a.intervals}
    cached: dict[int, tuple[int, int]] = {}
    for r in range(a.repeats):
        cold_prompt = [rng.randrange(vocab) for _ in range(a.total_len)]
        doc = [rng.randrange(vocab) for _ in range(a.doc_len)]
        first, second, third = (doc + [rng.randrange(vocab) for _ in range(q_len)] for _ in range(3))
        engines: list[int | None] = [None, *a.intervals]
        for key in engines[r % len(engines) :] + engines[: r % len(engines)]:  # a busy host slows them alike
            if key is None:
                off_times.append(ttft(off, f"off{r}", cold_prompt)[0])
            else:
                assert cores[key].scheduler.flush_cache()
                colds[key].append(ttft(cores[key], f"cold{r}", cold_prompt)[0])
        for n, core in cores.items():
            assert core.scheduler.flush_cache()
            ttft(core, f"first{r}", first)
            warm, hit2 = ttft(core, f"second{r}", second)
            warm3, hit3 = ttft(core, f"third{r}", third)
            warms[n].append(warm)
            branch[n].append(warm3)
            cached[n] = (hit2, hit3)
    base = statistics.median(off_times)
    print(f"cache off:     cold TTFT {base * 1000:7.1f} ms (one forward, no checkpoints)")
    for n in a.intervals:
        c, w, w3 = statistics.median(colds[n]), statistics.median(warms[n]), statistics.median(branch[n])
        print(
            f"interval={n:4d}  cold TTFT {c * 1000:7.1f} ms ({c / base:.2f}x cache off)  "
            f"warm TTFT {w * 1000:6.1f} ms  warm/cold {w / c:.3f}  warm/cache-off-cold {w / base:.3f}  "
            f"cached_tokens={cached[n][0]}  branch-hit TTFT {w3 * 1000:6.1f} ms ({w3 / base:.3f}) "
            f"cached_tokens={cached[n][1]}"
        )


if __name__ == "__main__":
    main()
