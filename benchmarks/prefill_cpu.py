"""Cold prefill of the bundled runtime, measured so that a busy shared host distorts it least.

Per cold 2048-token prefill (fresh prompt, flushed cache, radix cache and chunked prefill at their defaults,
in-process `EngineCore.step()` as in runtime_throughput.py): wall TTFT, the engine thread's CPU time (what the
work costs, whoever else holds the cores) and the process's voluntary context switches (OpenMP workers put to
sleep and woken: each parallel region costs two with OMP_WAIT_POLICY=PASSIVE). `--profile` prints torch.profiler
self CPU per op (and input shapes), the minimum over the runs: the run least disturbed by other processes.
`--by-module` prints wall time per module class (inclusive: a block's time contains its mixer's), min over runs.

    python benchmarks/prefill_cpu.py --model DIR [--threads 2] [--repeats 5] [--tokens 2048] [--profile]
        [--dtype auto|float32|bfloat16] [--memory-budget-gib 0.5] [--by-module]

To compare with an older runtime: `git archive <rev> runtime | tar -x -C /tmp/old` then run this script with
`PYTHONPATH=/tmp/old`.
"""

from __future__ import annotations

import argparse
import collections
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest, SamplingParams
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.engine.engine_core import EngineCore

flush_denormals_on_this_thread()  # as the server's engine thread does (runtime/engine/denormals.py)

VOCAB = 4000  # below the demo tokenizer's special tokens


def voluntary_switches() -> int:
    """Voluntary context switches of all this process's threads so far (Linux /proc)."""
    total = 0
    for status in Path("/proc/self/task").glob("*/status"):
        for line in status.read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                total += int(line.split()[1])
    return total


def cold_prefill(core: EngineCore, prompt: list[int], rid: str) -> tuple[float, float, int]:
    """(wall s to the first token, engine-thread CPU s, voluntary context switches) of one cold prefill."""
    assert core.scheduler.flush_cache()
    first: list[float] = []
    params = SamplingParams(temperature=0, max_new_tokens=1, ignore_eos=True)
    switches, cpu, wall = voluntary_switches(), time.thread_time(), time.perf_counter()
    core.scheduler.add_request(GenerateRequest(rid, prompt, params), lambda o: first.append(time.perf_counter()))
    while core.scheduler.has_work:
        core.step()
    return first[0] - wall, time.thread_time() - cpu, voluntary_switches() - switches


def time_modules(model: object, into: dict[str, float]) -> Callable[[], None]:
    """Accumulate each module class's inclusive wall time into `into` (forward hooks); returns the remover."""
    from torch import nn

    assert isinstance(model, nn.Module)
    started: dict[int, float] = {}

    def pre(module: nn.Module, _args: object) -> None:
        started[id(module)] = time.perf_counter()

    def post(module: nn.Module, _args: object, _out: object) -> None:
        into[type(module).__name__] += time.perf_counter() - started.pop(id(module))

    handles = [h for m in model.modules() for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))]
    return lambda: [h.remove() for h in handles] and None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model directory (python -m runtime.demo_model --out DIR)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--profile", action="store_true", help="per-op self CPU, min over the runs")
    ap.add_argument("--top", type=int, default=30, help="ops listed by --profile")
    ap.add_argument("--by-module", action="store_true", help="wall time per module class, min over the runs")
    ap.add_argument("--dtype", default="auto", help="the engine's --dtype (auto: bfloat16 for a bf16 checkpoint)")
    ap.add_argument("--memory-budget-gib", type=float, default=0.5, help="the engine's budget (weights included)")
    a = ap.parse_args()
    import torch  # after `runtime` (imported above), whose __init__ sets OpenMP's wait policy and malloc tuning

    torch.set_num_threads(a.threads)
    core = EngineCore(EngineArgs(model_path=a.model, memory_budget_gib=a.memory_budget_gib, dtype=a.dtype))
    rng = random.Random(0)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(VOCAB) for _ in range(n)]

    cold_prefill(core, prompt(a.tokens), "warmup")  # first-call allocations, lazy inits
    runs: list[tuple[float, float, int]] = []
    best: dict[tuple[str, str], float] = collections.defaultdict(lambda: float("inf"))
    per_module: dict[str, float] = collections.defaultdict(lambda: float("inf"))
    for i in range(a.repeats):
        if a.by_module:
            one: dict[str, float] = collections.defaultdict(float)
            remove = time_modules(core.model, one)
            runs.append(cold_prefill(core, prompt(a.tokens), f"cold{i}"))
            remove()
            for name, s in one.items():
                per_module[name] = min(per_module[name], s)
            continue
        if not a.profile:
            runs.append(cold_prefill(core, prompt(a.tokens), f"cold{i}"))
            continue
        from torch.profiler import profile

        with profile(record_shapes=True) as prof:
            runs.append(cold_prefill(core, prompt(a.tokens), f"cold{i}"))
        for e in prof.key_averages(group_by_input_shape=True):
            key = (e.key, str(e.input_shapes)[:80])
            best[key] = min(best[key], e.self_cpu_time_total / 1e3)
    wall, cpu, switches = (statistics.median(r[j] for r in runs) for j in range(3))
    print(
        f"model={a.model} threads={a.threads} tokens={a.tokens} repeats={a.repeats} (medians; min in brackets)\n"
        f"cold TTFT          {wall * 1e3:8.1f} ms  [{min(r[0] for r in runs) * 1e3:.1f}]\n"
        f"engine-thread CPU  {cpu * 1e3:8.1f} ms  [{min(r[1] for r in runs) * 1e3:.1f}]\n"
        f"voluntary context switches {switches:8.0f}"
    )
    for name, sec in sorted(per_module.items(), key=lambda kv: -kv[1]):
        print(f"{sec * 1e3:8.1f} ms  {name}")
    for (name, shapes), ms in sorted(best.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"{ms:8.2f} ms  {name:45s} {shapes}")


if __name__ == "__main__":
    main()
