"""A decode step's host time outside the model forward, two runtime trees interleaved (in-process, no server).

Each measurement is a fresh process running one tree's `EngineCore` (eager, --threads intra-op threads): --batch
greedy ignore-EOS requests of a 128-token prompt decode --steps tokens; per decode step it times `EngineCore.step()`
and the `ModelRunner.forward` inside it in the thread's CPU time (so a wait for a core counts in neither: with one
intra-op thread the forward runs on this thread), and reports the medians of step - forward (schedule,
ModelRunner.prepare, sampling, stop checks, emitting each request's output) and of the forward. Processes alternate
A, B, B, A, ... per round and batch size, so both trees see the same host load; prints medians over rounds and B/A.

    python benchmarks/step_host_cost.py --a TREE_A --b TREE_B --model DIR [--batch 1,8] [--rounds 4]
        [--steps 200] [--threads 1]

A small model (a two-layer variant of the demo model) makes the host work a large share of the step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, statistics, sys, time
import torch
from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest, SamplingParams
from runtime.engine.engine_core import EngineCore

model, batch, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
core = EngineCore(EngineArgs(model_path=model, context_length=4096, max_running_requests=max(8, batch)))
sched, runner = core.scheduler, core.runner
for i in range(batch):
    sampling = SamplingParams(temperature=0.0, max_new_tokens=steps + 20, ignore_eos=True)
    sched.add_request(GenerateRequest(rid=f"r{i}", input_ids=[5 + (i * 7 + j) % 3000 for j in range(128)],
                                      sampling=sampling), lambda out: None)
while any(r.in_prefill or r.mem is None for r in sched.running + sched.waiting):
    core.step()
for _ in range(10):
    core.step()
forward = runner.forward
spent = [0.0]

def timed(fb):
    t = time.thread_time()
    try:
        return forward(fb)
    finally:
        spent[0] = time.thread_time() - t

runner.forward = timed
host, fwd = [], []
for _ in range(steps):
    t = time.thread_time()
    core.step()
    total = time.thread_time() - t
    host.append((total - spent[0]) * 1e6)
    fwd.append(spent[0] * 1e6)
print(json.dumps({"host_us": statistics.median(host), "forward_us": statistics.median(fwd)}))
"""


def run(tree: Path, model: Path, batch: int, steps: int, threads: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), str(batch), str(steps), str(threads)],
        cwd=tree, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", type=Path, required=True)
    ap.add_argument("--b", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for r in range(a.rounds):
        for batch in [int(b) for b in a.batch.split(",")]:
            order = [("A", a.a), ("B", a.b)] if r % 2 == 0 else [("B", a.b), ("A", a.a)]
            for label, tree in order:
                results.setdefault((label, batch), []).append(run(tree, a.model, batch, a.steps, a.threads))
    print(f"load average at end: {os.getloadavg()}")
    print(f"A = {a.a}, B = {a.b}; medians over {a.rounds} rounds (each the median of {a.steps} decode steps)")
    for batch in [int(b) for b in a.batch.split(",")]:
        for key in ("host_us", "forward_us"):
            va = [x[key] for x in results[("A", batch)]]
            vb = [x[key] for x in results[("B", batch)]]
            ma, mb = statistics.median(va), statistics.median(vb)
            print(
                f"  batch {batch:2d} {key:10s}  A {ma:8.1f} ({min(va):.1f}-{max(va):.1f})"
                f"  B {mb:8.1f} ({min(vb):.1f}-{max(vb):.1f})  B/A {mb / ma:.2f}"
            )


if __name__ == "__main__":
    main()
