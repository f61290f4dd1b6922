"""Engine start-up time with the elastic pool vs the fixed KV/state split, at several memory budgets.

    python benchmarks/elastic_startup.py [--model-path DIR] [--budgets-gib 1 4 16] [--repeats 2] [--threads 1]

Each configuration builds one in-process `EngineCore` (weights, pools, cache; no HTTP) with the budget as
`memory_budget_gib` and the planner's default split, and reports the wall time of the constructor and the
pool geometry it got. Both modes allocate the same pool bytes; the elastic pool additionally carves them into
chunks and hands the top chunks to the state pool, which must cost about as little as the fixed split's set-up.
The two modes alternate `--repeats` times and each reports its fastest build (a shared machine's noise only adds
time). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

import torch

from runtime.core.config import EngineArgs
from runtime.engine.engine_core import EngineCore


def build_seconds(model: str, budget_gib: float, elastic: bool) -> tuple[float, int, int]:
    """(seconds to build the engine, KV tokens, state slots) for one configuration."""
    t0 = time.perf_counter()
    core = EngineCore(EngineArgs(model_path=model, memory_budget_gib=budget_gib, enable_elastic_memory_pool=elastic))
    seconds = time.perf_counter() - t0
    stats = core.stats()
    del core
    gc.collect()
    return seconds, stats.max_total_num_tokens, stats.max_mamba_cache_size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", help="model directory (default: build the demo model in a temp dir)")
    p.add_argument("--budgets-gib", type=float, nargs="+", default=[1.0, 4.0, 16.0])
    p.add_argument("--repeats", type=int, default=2, help="builds per configuration; the fastest is reported")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = args.model_path
    if model is None:
        from runtime.demo_model import build_demo_model

        model = str(build_demo_model(Path(tempfile.mkdtemp()) / "demo"))
    build_seconds(model, 0.25, True)  # untimed: the first engine pays the imports (torch._dynamo, ...)
    print(f"model {model}; torch threads {args.threads}\n")
    print("| budget GiB | mode | KV tokens | state slots | start-up s |")
    print("|---|---|---|---|---|")
    for budget in args.budgets_gib:
        best: dict[bool, tuple[float, int, int]] = {}
        for _ in range(args.repeats):
            for elastic in (False, True):
                run = build_seconds(model, budget, elastic)
                best[elastic] = min(best.get(elastic, run), run)
        for elastic, (seconds, kv, slots) in best.items():
            mode = "elastic" if elastic else "fixed split"
            print(f"| {budget:g} | {mode} | {kv} | {slots} | {seconds:.2f} |", flush=True)


if __name__ == "__main__":
    main()
