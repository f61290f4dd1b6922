"""Where `--enable-torch-compile`'s start-up goes: builds the engine in-process with a server command line's flags
and prints the compile's wall time split into dynamo tracing, AOTAutograd and inductor, plus inductor's on-disk
cache hits and misses (FX graph cache, AOTAutograd cache) and the graphs compiled.

Run it with a fresh `TORCHINDUCTOR_CACHE_DIR` for a cold start and again with the same one for a warm start:

    export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)
    python benchmarks/compile_startup.py --model PEER_MODEL --context-length 16384 --max-running-requests 8 \
        --enable-torch-compile --num-threads 2          # cold
    python benchmarks/compile_startup.py ...same flags...   # warm

`--json FILE` also writes the numbers. The flags are `python -m runtime`'s (hybridshared/flags/runtime_args.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    own, rest = ap.parse_known_args()
    from hybridshared.flags.runtime_parser import parse_args

    args = parse_args(rest)
    import torch

    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    from torch._dynamo.utils import compilation_time_metrics, counters

    from runtime.core.config import engine_args
    from runtime.engine.builder import build_engine

    t0, c0 = time.perf_counter(), time.process_time()
    parts = build_engine(engine_args(args, "cpu"))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    runner = parts.runner
    result: dict[str, Any] = {
        "flags": rest,
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR", "(default)"),
        "build_engine_s": round(wall, 1),
        "process_cpu_s": round(cpu, 1),
        "decode_compile_s": round(runner.compiled_decode.report.elapsed_s, 1) if runner.compiled_decode else None,
        "extend_compile_s": round(runner.compiled_extend.report.elapsed_s, 1) if runner.compiled_extend else None,
        "allocated_slots": {
            "tokens": [t.shape[0] for t in parts.pools.buffers.k][:1],
            "states": [t.shape[0] for t in parts.pools.buffers.conv][:1],
        },
        "used_slots": {"tokens": parts.pools.num_token_slots, "states": parts.pools.num_state_slots},
        "inductor": {k: v for k, v in counters["inductor"].items() if "cache" in k},
        "aot_autograd": {k: v for k, v in counters["aot_autograd"].items() if "cache" in k},
        "unique_graphs": counters["stats"]["unique_graphs"],
        "load_average": os.getloadavg(),
    }
    # dynamo_timed phases (nested: a phase's time includes the ones it calls), summed over the graphs.
    phases = {name: round(sum(times), 2) for name, times in compilation_time_metrics.items()}
    top = sorted(phases.items(), key=lambda kv: -kv[1])[:14]
    result["phases_s"] = dict(top)
    text = json.dumps(result, indent=1)
    print(text)
    if own.json:
        own.json.write_text(text + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
