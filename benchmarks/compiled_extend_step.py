"""Short one-sequence extends, eager vs compiled (runtime/engine/compiled_extend.py), no scheduler.

For each token count (default 8 16 32 48 64) and cached-prefix length (default 0 and 1984), times the model's
eager forward and `CompiledExtend` on the same synthetic extend (state slot 0, token slots from 0, a state
checkpoint after half the new tokens when --checkpoint), alternating the two, 7 rounds x 10 calls. Prints the
median ms per forward of each and their ratio, and the compile time of the buckets. --cpp-wrapper compiles with
inductor's C++ wrapper instead (what the compiled decode ships; ~45 s per bucket on a cold cache here).

    python benchmarks/compiled_extend_step.py --model DIR [--threads 2] [--tokens 8 16 64] [--prefix 0 1984]
        [--checkpoint] [--cpp-wrapper]
"""

from __future__ import annotations

import argparse
import statistics
import time

from runtime.core.config import EngineArgs
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.engine.engine_core import EngineCore

flush_denormals_on_this_thread()  # as the server's engine thread does (runtime/engine/denormals.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model directory (python -m runtime.demo_model --out DIR)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, nargs="+", default=[8, 16, 32, 48, 64])
    ap.add_argument("--prefix", type=int, nargs="+", default=[0, 1984])
    ap.add_argument("--checkpoint", action="store_true", help="a state checkpoint after half the new tokens")
    ap.add_argument("--cpp-wrapper", action="store_true", help="inductor's C++ wrapper (default: Python's)")
    a = ap.parse_args()
    import torch  # after `runtime`, whose __init__ sets OpenMP's wait policy and malloc tuning

    from runtime.engine import compiled_extend

    torch.set_num_threads(a.threads)
    if a.cpp_wrapper:
        compile_fn = torch.compile
        compiled_extend.torch.compile = lambda f, **kw: compile_fn(f, options={"cpp_wrapper": True}, **kw)  # type: ignore[assignment]
    need = max(a.prefix) + 2 * max(a.tokens)
    core = EngineCore(EngineArgs(model_path=a.model, memory_budget_gib=0.5))
    if core.pools.num_token_slots < need:
        raise SystemExit(f"the KV pool holds {core.pools.num_token_slots} tokens; these shapes need {need}")
    buffers = core.pools.buffers
    ce = compiled_extend.CompiledExtend(
        core.model, max(a.tokens), core.cache.state_pool.copy, padding_slot=core.pools.num_state_slots
    )
    t0 = time.perf_counter()
    report = ce.warm_up(buffers)
    if not report.enabled:
        raise SystemExit(f"not compiled: {report.reason}")
    print(f"model={a.model} threads={a.threads} buckets={ce.buckets} compile {time.perf_counter() - t0:.1f} s")
    slot = core.pools.num_state_slots if a.checkpoint else None
    print(f"{'tokens':>6} {'prefix':>6} {'bucket':>6} {'eager ms':>9} {'compiled ms':>12} {'ratio':>6}")
    with torch.inference_mode():
        for tokens in a.tokens:
            for prefix in a.prefix:
                batch = compiled_extend._warmup_batch(tokens, prefix, 4000, slot)
                runs: dict[str, list[float]] = {"eager": [], "compiled": []}
                calls = {
                    "eager": lambda b=batch: core.model.forward(b, buffers),
                    "compiled": lambda b=batch: ce(b, buffers),
                }
                for call in calls.values():
                    call()  # first-call effects
                for _ in range(7):
                    for name, call in calls.items():
                        start = time.perf_counter()
                        for _ in range(10):
                            call()
                        runs[name].append((time.perf_counter() - start) / 10 * 1e3)
                eager, compiled = statistics.median(runs["eager"]), statistics.median(runs["compiled"])
                print(
                    f"{tokens:>6} {prefix:>6} {ce.bucket_for(tokens):>6} {eager:>9.2f} {compiled:>12.2f} "
                    f"{compiled / eager:>6.2f}"
                )


if __name__ == "__main__":
    main()
