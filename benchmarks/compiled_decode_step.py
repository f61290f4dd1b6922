"""One decode forward, eager vs compiled (runtime/engine/compiled_decode.py), no scheduler.

Times `CompiledDecode`'s compiled function (or the same function eager) on a synthetic decode batch of B
sequences with 100 cached tokens each, one thread, `--blocks` blocks of `--calls` calls. Prints median wall ms,
min wall ms and median / min process CPU ms per call for batch 1 and 8. Options try the knobs
about: guards evaluated on every call (--no-skip-guards), inductor's `freezing`, and the generated Python wrapper
instead of the shipped C++ one (--python-wrapper). `--profile` prints torch.profiler's op table of one block
per batch size (extern matmuls vs the graph's C++ kernels).

`--ab` compares variants in ONE process, interleaved block by block (a shared 2-core host drifts; ratios
within one run are what to trust): "shipped" is `CompiledDecode` as the engine runs it, "mark-every-call" the
same graphs with the dynamic-dim marks set on every call (the older form); "base" is the shipped inductor
options compiled again, "python-wrapper" and "freezing" the inductor knobs, each its own compiled code object,
so the graphs do not mix.

Pass the harness's pool sizes (`--context-length 16384 --max-running-requests 8`, benchmarks/peers/engines.py)
to reuse the graphs it left in inductor's on-disk cache: the pool buffers' shapes are part of every graph.

    python benchmarks/compiled_decode_step.py [--model DIR] [--context-length N] [--max-running-requests N]
        [--eager] [--no-skip-guards] [--freezing] [--python-wrapper] [--profile [--kernel-profile]]
        [--ab base,python-wrapper]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from runtime.core.config import EngineArgs
from runtime.demo_model import build_demo_model
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.engine.engine_core import EngineCore

flush_denormals_on_this_thread()  # as the server's engine thread does (runtime/engine/denormals.py)

BATCHES = (1, 8)
KV_LEN = 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model directory (default: build the demo model in a temp dir)")
    ap.add_argument("--context-length", type=int, help="as the server's flag (pool sizes: graph shapes)")
    ap.add_argument("--max-running-requests", type=int, help="as the server's flag (pool sizes: graph shapes)")
    ap.add_argument("--eager", action="store_true", help="time the same function without compiling it")
    ap.add_argument("--no-skip-guards", action="store_true", help="evaluate every dynamo guard on each call")
    ap.add_argument("--freezing", action="store_true", help="torch._inductor.config.freezing = True")
    ap.add_argument("--python-wrapper", action="store_true", help="inductor's Python wrapper (cpp_wrapper off)")
    ap.add_argument("--profile", action="store_true", help="print torch.profiler's op table per batch size")
    ap.add_argument(
        "--kernel-profile",
        action="store_true",
        help="with --profile: the Python wrapper and a profiler record per generated C++ kernel (a cold compile)",
    )
    ap.add_argument("--ab", help="comma-separated variants timed interleaved: base, python-wrapper, freezing")
    ap.add_argument("--blocks", type=int, default=7)
    ap.add_argument("--calls", type=int, default=30)
    a = ap.parse_args()
    import torch
    import torch._inductor.config as inductor_config

    from runtime.engine import compiled_decode

    inductor_config.freezing = a.freezing
    if a.kernel_profile:
        inductor_config.cpp.enable_kernel_profile = True
    if a.python_wrapper or a.kernel_profile:
        compiled_decode._INDUCTOR_OPTIONS["cpp_wrapper"] = False
    torch.set_num_threads(1)
    model = a.model or str(build_demo_model(Path(tempfile.mkdtemp()) / "demo"))
    sizing = {"context_length": a.context_length, "max_running_requests": a.max_running_requests}
    core = EngineCore(EngineArgs(model_path=model, memory_budget_gib=0.3, **sizing))
    buffers = core.pools.buffers
    print(f"load average {os.getloadavg()[0]:.2f}; torch {torch.__version__}")
    decode = compiled_decode.CompiledDecode(core.model, 8)
    fns: dict[str, Callable[..., object]] = {}
    if a.eager:
        fns["eager"] = decode._eager
    elif a.ab:
        names = a.ab.split(",")
        if {"shipped", "mark-every-call"} & set(names):
            print(f"shipped warm-up: {decode.warm_up(buffers)}")
        fns = _variants(decode, buffers, names)
    else:
        t0 = time.perf_counter()
        report = decode.warm_up(buffers)
        print(f"warm-up {time.perf_counter() - t0:.1f} s: {report}")
        decode.skip_guards = not a.no_skip_guards
        fns["compiled"] = decode._run
    vocab = core.model.layout().vocab_size
    with torch.inference_mode():
        for batch in BATCHES:
            inputs = compiled_decode._warmup_inputs(batch, KV_LEN, vocab, torch.device("cpu"))
            for fn in fns.values():
                fn(*inputs, buffers)  # settle (first-call allocations)
            walls: dict[str, list[float]] = {name: [] for name in fns}
            cpus: dict[str, list[float]] = {name: [] for name in fns}
            for _ in range(a.blocks):
                for name, fn in fns.items():
                    w, c = time.perf_counter(), time.process_time()
                    for _ in range(a.calls):
                        fn(*inputs, buffers)
                    walls[name].append((time.perf_counter() - w) / a.calls * 1000)
                    cpus[name].append((time.process_time() - c) / a.calls * 1000)
            for name in fns:
                print(
                    f"batch {batch} {name}: {statistics.median(walls[name]):.3f} ms wall"
                    f" (min {min(walls[name]):.3f}), {statistics.median(cpus[name]):.3f} ms CPU"
                    f" (min {min(cpus[name]):.3f})"
                )
            if a.profile:
                for name, fn in fns.items():
                    _profile(f"batch {batch} {name}", lambda fn=fn, inputs=inputs: fn(*inputs, buffers), a.calls)
    print(f"load average {os.getloadavg()[0]:.2f}")


def _variants(decode: object, buffers: object, names: list[str]) -> dict[str, Callable[..., object]]:
    """One compiled function per variant, each warmed up for batch 1 and batch > 1 (run_compiled with skip_guards:
    each variant is its own code object, so skipping the guards cannot mix variants)."""
    import torch
    import torch._inductor.config as inductor_config

    from runtime.engine import compiled_decode as cd
    from runtime.engine.compile_support import copy_function, restored, run_compiled

    assert isinstance(decode, cd.CompiledDecode)
    out: dict[str, Callable[..., object]] = {}
    vocab = decode.model.layout().vocab_size
    for name in names:
        if name == "shipped":
            out[name] = decode._run
            continue
        if name == "mark-every-call":  # the shipped graphs, with the dynamic-dim marks set on every call
            out[name] = lambda *inputs: (cd.mark_dynamic_dims(cd._DecodeInputs(*inputs[:6])), decode._run(*inputs))
            continue
        options = dict(cd._INDUCTOR_OPTIONS)
        freezing = name == "freezing"
        if name == "python-wrapper":
            options["cpp_wrapper"] = False
        elif name not in ("base", "freezing"):
            raise SystemExit(
                f"--ab: unknown variant {name!r} (shipped, mark-every-call, base, python-wrapper, freezing)"
            )
        compiled = torch.compile(
            copy_function(decode._eager, f"decode_{name.replace('-', '_')}"), fullgraph=True, options=options
        )

        def run(
            *inputs: torch.Tensor, compiled: Callable[..., torch.Tensor] = compiled, skip: bool = True
        ) -> torch.Tensor:
            batch = inputs[0].shape[0]
            if batch > 1:
                for t in inputs[:6]:
                    torch._dynamo.mark_dynamic(t, 0)
            torch._dynamo.mark_dynamic(inputs[4], 1)
            torch._dynamo.mark_dynamic(inputs[5], 3)
            return run_compiled(compiled, *inputs, skip_guards=skip)

        t0 = time.perf_counter()
        inductor_config.freezing = freezing
        with torch.inference_mode(), restored(buffers, 8 * 60, 8):  # type: ignore[arg-type]
            decode._eager(*cd._warmup_inputs(1, cd._WARMUP_KV_LEN[0], vocab, decode.device), buffers)
            for batch in (1, 3):
                for kv_len in cd._WARMUP_KV_LEN:
                    run(*cd._warmup_inputs(batch, kv_len, vocab, decode.device), buffers, skip=False)
        inductor_config.freezing = False
        print(f"variant {name}: compiled in {time.perf_counter() - t0:.1f} s")
        out[name] = run
    return out


def _profile(title: str, step: Callable[[], object], calls: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            step()
    events = prof.key_averages()
    total_us = sum(e.self_cpu_time_total for e in events) / calls
    print(f"--- {title}: {total_us / 1000:.3f} ms self CPU per step in profiled ops")
    rows = sorted(events, key=lambda e: -e.self_cpu_time_total)[:40]
    for e in rows:
        print(
            f"  {e.key[:70]:70s} calls/step {e.count / calls:6.1f}  self us/step {e.self_cpu_time_total / calls:8.1f}"
        )


if __name__ == "__main__":
    main()
