"""Where a warm request's TTFT goes, in-process: the peers harness's cold / warm / repeat sequence on one engine,
each request's steps timed by phase (admission + schedule, batch tensors, forward, postprocess with sampling),
how many prompt tokens the prefix cache served, and the forward's op count (torch.profiler).

The harness (benchmarks/peers/workloads.py) sends ids, so there is no tokenization on this path; the HTTP side
is measured by benchmarks/server_overhead.py. Default flags are the harness's: --context-length 16384
--max-running-requests 8, eager.

    python benchmarks/warm_ttft_profile.py [--model DIR] [--reps 5] [--threads 2] [--interval N] [--ops]
"""

from __future__ import annotations

import argparse
import collections
import random
import statistics
import time
from dataclasses import dataclass, field

import runtime  # noqa: F401 - first: its OpenMP and malloc settings only take effect before torch loads

# isort: split
import torch

from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest, RequestOutput, SamplingParams
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.engine.engine_core import EngineCore

flush_denormals_on_this_thread()  # as the server's engine thread does

COLD_LEN, WARM_SHARED, OUT = 2048, 2000, 8  # benchmarks/peers/workloads.py


@dataclass
class Trace:
    phases: dict[str, float] = field(default_factory=lambda: collections.defaultdict(float))  # wall s
    cpu: dict[str, float] = field(default_factory=lambda: collections.defaultdict(float))  # process CPU s
    extend_tokens: list[int] = field(default_factory=list)
    ttft: float = 0.0
    cached: int = 0


def run_request(core: EngineCore, rid: str, prompt: list[int], max_new: int) -> Trace:
    """One request alone on the engine, its prefill steps timed by phase up to the first token."""
    tr = Trace()
    first: list[float] = []

    def on_output(o: RequestOutput) -> None:
        if not first and o.new_token_ids:
            first.append(time.perf_counter())
        if o.finished:
            tr.cached = o.cached_tokens

    sched, runner = core.scheduler, core.runner
    t0 = time.perf_counter()
    params = SamplingParams(temperature=0, max_new_tokens=max_new, ignore_eos=True)
    sched.add_request(GenerateRequest(rid, prompt, params), on_output)
    tr.phases["add_request"] += time.perf_counter() - t0
    while sched.has_work:
        stamps = [(time.perf_counter(), time.process_time())]
        batch = sched.schedule()
        stamps.append((time.perf_counter(), time.process_time()))
        assert batch is not None
        fb = runner.prepare(batch)
        batch.forward = fb
        stamps.append((time.perf_counter(), time.process_time()))
        logits = runner.forward(fb)
        stamps.append((time.perf_counter(), time.process_time()))
        sched.postprocess(batch, logits)
        stamps.append((time.perf_counter(), time.process_time()))
        if not first or first[0] >= stamps[0][0]:  # steps up to the first token
            names = ["schedule (admit, match, grow)", "prepare (batch tensors)", f"forward ({batch.mode})",
                     "postprocess (sample, emit)"]  # fmt: skip
            for name, (w0, c0), (w1, c1) in zip(names, stamps[:-1], stamps[1:], strict=True):
                tr.phases[name] += w1 - w0
                tr.cpu[name] += c1 - c0
            if batch.mode == "extend":
                tr.extend_tokens.append(sum(len(t) for t in batch.tokens))
    tr.ttft = first[0] - t0
    return tr


def op_table(core: EngineCore, prompt: list[int], rows: int) -> str:
    """The ops the warm request's steps up to its first token dispatch (torch.profiler): total, then the top
    `rows` by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        tr = run_request(core, "ops", prompt, 1)
    ev = prof.key_averages()
    total = sum(e.count for e in ev if e.key.startswith("aten::"))
    table = ev.table(sort_by="self_cpu_time_total", row_limit=rows)
    return f"warm request aten ops: {total} (cached {tr.cached}, extend tokens {tr.extend_tokens})\n{table}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model directory (the peers harness's peer model)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--interval", type=int, default=None, help="mamba_track_interval (default: the runtime's)")
    ap.add_argument("--ops", type=int, default=0, help="also profile the warm request: its top N ops (torch.profiler)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    extra = {} if a.interval is None else {"mamba_track_interval": a.interval}
    core = EngineCore(EngineArgs(model_path=a.model, context_length=16384, max_running_requests=8, **extra))
    vocab = int(core.model.config.vocab_size) if hasattr(core.model, "config") else 4096
    rng = random.Random(0)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    run_request(core, "warmup", fresh(COLD_LEN), 4)
    traces: dict[str, list[Trace]] = {"cold": [], "warm": [], "repeat": []}
    for r in range(a.reps):
        cold = fresh(COLD_LEN)
        warm = cold[:WARM_SHARED] + fresh(COLD_LEN - WARM_SHARED)
        traces["cold"].append(run_request(core, f"c{r}", cold, OUT))
        traces["warm"].append(run_request(core, f"w{r}", warm, OUT))
        traces["repeat"].append(run_request(core, f"r{r}", cold, OUT))
    print(f"model={a.model} threads={a.threads} interval={core.scheduler.config.checkpoint_interval} reps={a.reps}")
    for kind, trs in traces.items():
        ttft = statistics.median(t.ttft for t in trs)
        print(f"{kind:6s} TTFT {ttft * 1e3:7.2f} ms  cached={trs[-1].cached}  extend tokens={trs[-1].extend_tokens}")
        for name in trs[-1].phases:
            ms = statistics.median(t.phases.get(name, 0.0) for t in trs) * 1e3
            cpu = statistics.median(t.cpu.get(name, 0.0) for t in trs) * 1e3
            print(f"    {name:32s} {ms:8.3f} ms wall {cpu:8.3f} ms CPU")
    c, w = (statistics.median(t.ttft for t in traces[k]) for k in ("cold", "warm"))
    print(f"warm/cold {w / c:.3f}")
    if a.ops:
        cold = fresh(COLD_LEN)
        run_request(core, "opc", cold, OUT)
        print(op_table(core, cold[:WARM_SHARED] + fresh(COLD_LEN - WARM_SHARED), a.ops))


if __name__ == "__main__":
    main()
