"""Elastic pool vs fixed KV/state splits of the same bytes, under a workload that shifts from long prompts to
many short ones. In-process engines (no HTTP), one model, one run per configuration; prints a markdown table.

    python benchmarks/elastic_pool.py [--model-path DIR] [--pool-mib 48] [--long 8 --long-tokens 1200]
        [--short 64 --short-tokens 20] [--state-fractions 0.1 0.25 0.5 0.75 0.9]

Phase A queues the long prompts at once and runs them to the end; phase B then queues the short ones. For
each configuration: peak and mean running requests per phase (how many requests the memory lets run at
once), engine steps, and the elastic pool's moves. Every configuration gets the same pool bytes: fixed splits
put a fraction of them in state slots, the elastic pool starts at --elastic-start and moves chunks itself.
The running cap is the planner's: state slots // slots_per_request (the elastic pool recomputes it as
slots move).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hybridshared.model.shape import load_model_shape
from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest, SamplingParams
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.engine.engine_core import EngineCore

flush_denormals_on_this_thread()  # as the server's engine thread does (runtime/engine/denormals.py)


@dataclass
class PhaseResult:
    peak: int
    mean: float
    steps: int
    seconds: float


def run_phase(core: EngineCore, reqs: list[GenerateRequest]) -> PhaseResult:
    done: set[str] = set()
    for r in reqs:
        core.scheduler.add_request(r, lambda o: done.add(o.rid) if o.finished else None)
    peak, total, steps = 0, 0, 0
    t0 = time.perf_counter()
    while core.scheduler.has_work:
        core.step()
        steps += 1
        running = len(core.scheduler.running)
        peak, total = max(peak, running), total + running
    assert len(done) == len(reqs)
    return PhaseResult(peak, total / max(steps, 1), steps, time.perf_counter() - t0)


def workload(args: argparse.Namespace, vocab: int) -> tuple[list[GenerateRequest], list[GenerateRequest]]:
    rng = random.Random(0)

    def req(rid: str, n: int, new: int) -> GenerateRequest:
        ids = [rng.randrange(1, vocab - 1) for _ in range(n)]
        return GenerateRequest(rid, ids, SamplingParams(temperature=0.0, max_new_tokens=new, ignore_eos=True))

    long = [req(f"long{i}", args.long_tokens, args.long_new) for i in range(args.long)]
    short = [req(f"short{i}", args.short_tokens, args.short_new) for i in range(args.short)]
    return long, short


def engine(model: str, kv_tokens: int, slots: int, elastic: bool) -> EngineCore:
    return EngineCore(EngineArgs(
        model_path=model, memory_budget_gib=2.0, max_total_tokens=kv_tokens, max_mamba_cache_size=slots,
        chunked_prefill_size=2048, enable_elastic_memory_pool=elastic,
    ))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", help="model directory (default: build the demo model in a temp dir)")
    p.add_argument("--pool-mib", type=float, default=48.0, help="KV + state bytes of every configuration")
    p.add_argument("--long", type=int, default=8)
    p.add_argument("--long-tokens", type=int, default=1200)
    p.add_argument("--long-new", type=int, default=8)
    p.add_argument("--short", type=int, default=64)
    p.add_argument("--short-tokens", type=int, default=20)
    p.add_argument("--short-new", type=int, default=16)
    p.add_argument("--state-fractions", type=float, nargs="+", default=[0.1, 0.25, 0.5, 0.75, 0.9])
    p.add_argument("--elastic-start", type=float, default=0.5, help="the elastic pool's starting fraction")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = args.model_path
    if model is None:
        from runtime.demo_model import build_demo_model

        model = str(build_demo_model(Path(tempfile.mkdtemp()) / "demo"))
    spec = load_model_shape(model, ssm_dtype="float32", kv_dtype="float32")
    state_bytes = spec.mamba_state_bytes_per_request
    kv_bytes = spec.kv_bytes_per_token
    budget = int(args.pool_mib * (1 << 20))
    long, short = workload(args, spec.vocab_size)

    def split(fraction: float) -> tuple[int, int]:
        slots = max(4, int(fraction * budget / state_bytes) - 1)  # the planner adds a padding slot
        return (budget - (slots + 1) * state_bytes) // kv_bytes, slots

    configs = [(f"fixed {f:.2f} state", *split(f), False) for f in args.state_fractions]
    configs.append((f"elastic (starts {args.elastic_start:.2f})", *split(args.elastic_start), True))
    print(f"model {model}; pool {args.pool_mib:g} MiB; KV {kv_bytes} B/token, state {state_bytes} B/slot; "
          f"phase A: {args.long} x {args.long_tokens}-token prompts (+{args.long_new}); "
          f"phase B: {args.short} x {args.short_tokens}-token prompts (+{args.short_new})\n")  # fmt: skip
    print("| configuration | start KV tokens | start slots | A peak | A mean | A steps | B peak | B mean | "
          "B steps | total steps | mean running | moves | seconds |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, kv_tokens, slots, elastic in configs:
        core = engine(model, kv_tokens, slots, elastic)
        a, b = run_phase(core, long), run_phase(core, short)
        moves = core.elastic.counters.moves if core.elastic is not None else 0
        steps = a.steps + b.steps
        mean = (a.mean * a.steps + b.mean * b.steps) / steps
        cells = [name, kv_tokens, slots, a.peak, f"{a.mean:.1f}", a.steps, b.peak, f"{b.mean:.1f}", b.steps,
                 steps, f"{mean:.1f}", moves, f"{a.seconds + b.seconds:.1f}"]  # fmt: skip
        print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    main()
