"""A/B of two runtime trees on the peers harness's prefix-cache rows, over HTTP: cold, warm, exact-repeat and
shared-prefix TTFT, both servers up at once, rounds alternating A, B / B, A (serving_ab.py's scheme: a shared
host's load hits both alike).

Per round and server, as benchmarks/peers/workloads.py: a fresh 2048-token prompt (cold), its first 2000 tokens
+ 48 fresh ones (warm), the cold prompt again (repeat), 8 output tokens each; and the generated-shared-prefix
shape (4 groups x 4 prompts, 512-token system prompt + 64-token question, 32 output tokens, 8 in flight; mean
TTFT), fresh prompts per round. Besides wall-clock TTFT it reads the server process's CPU time
(/proc/PID/stat) over each request, which moves much less with the host's load. Servers run the harness's
sizing flags (--context-length 16384 --max-running-requests 8) in the default (eager) configuration.

    python benchmarks/prefix_ttft_ab.py --a TREE_A [--b TREE_B] [--model DIR] [--rounds 5] [--runtime-arg=FLAG ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))
sys.path.insert(0, str(HERE))

import engines  # noqa: E402
import workloads  # noqa: E402
from clients import RequestResult, RuntimeClient  # noqa: E402
from http_stream import Connections  # noqa: E402
from serving_ab import Server, start, stop, wait_healthy  # noqa: E402

SIZING = ["--context-length", str(engines.CONTEXT_LEN), "--max-running-requests", str(engines.PARALLEL)]
VOCAB_FIRST, VOCAB_END = 10, 4000


def process_cpu_s(pid: int) -> float:
    """utime + stime of the whole process (every thread), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one(url: str, prompt: list[int], max_new: int) -> RequestResult:
    async with Connections() as http:
        return await RuntimeClient(url).generate(http, prompt, max_new)


async def shared_prefix(url: str, prompts: list[list[int]]) -> float:
    """Mean TTFT (s) of the generated-shared-prefix prompts, GSP_CONCURRENCY in flight."""
    gate = asyncio.Semaphore(workloads.GSP_CONCURRENCY)
    async with Connections() as http:
        client = RuntimeClient(url)

        async def go(p: list[int]) -> RequestResult:
            async with gate:
                return await client.generate(http, p, workloads.GSP_SHAPE.output_len)

        results = await asyncio.gather(*(go(p) for p in prompts))
    return statistics.mean(r.ttft_s for r in results)


def record(samples: dict[str, list[float]], key: str, value: float) -> None:
    samples.setdefault(key, []).append(value)


def round_on(
    s: Server, samples: dict[str, list[float]], cold: list[int], warm: list[int], gsp: list[list[int]]
) -> None:
    out = workloads.REPEAT_OUT
    for kind, prompt in (("cold", cold), ("warm", warm), ("repeat", cold)):
        cpu0 = process_cpu_s(s.proc.pid)
        r = asyncio.run(one(s.url, prompt, out))
        record(samples, f"{kind} TTFT ms", 1000 * r.ttft_s)
        record(samples, f"{kind} server CPU ms", 1000 * (process_cpu_s(s.proc.pid) - cpu0))
        record(samples, f"{kind} cached tokens", float(r.cached_tokens or 0))
    record(samples, "shared-prefix mean TTFT ms", 1000 * asyncio.run(shared_prefix(s.url, gsp)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", type=Path, required=True, help="tree A (its runtime/ is served)")
    ap.add_argument("--b", type=Path, default=HERE.parent, help="tree B (default: this script's tree)")
    ap.add_argument("--model", type=Path, default=engines.WORK / "peer-model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runtime-arg", action="append", default=[], metavar="ARG", help="one more flag, both servers")
    args = ap.parse_args()
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"error: {args.model} is not a model directory (build it: python benchmarks/peers/run.py)")
    flags = SIZING + args.runtime_arg
    servers = [start("A", args.a.resolve(), args.model, args.threads, flags, {}),
               start("B", args.b.resolve(), args.model, args.threads, flags, {})]  # fmt: skip
    rng = random.Random(0)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(VOCAB_FIRST, VOCAB_END) for _ in range(n)]

    samples: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
    loads = []
    try:
        for s in servers:
            wait_healthy(s)
            asyncio.run(one(s.url, fresh(workloads.COLD_LEN), 4))  # warm-up
        loads.append(os.getloadavg())
        shape = workloads.GSP_SHAPE
        for r in range(args.rounds):
            cold = fresh(workloads.COLD_LEN)
            warm = cold[: workloads.WARM_SHARED] + fresh(workloads.COLD_LEN - workloads.WARM_SHARED)
            gsp = []
            for _ in range(shape.num_groups):
                system = fresh(shape.system_prompt_len)
                gsp += [system + fresh(shape.question_len) for _ in range(shape.prompts_per_group)]
            rng.shuffle(gsp)
            for s in servers if r % 2 == 0 else servers[::-1]:
                round_on(s, samples[s.label], cold, warm, gsp)
            time.sleep(0.2)
        loads.append(os.getloadavg())
    finally:
        stop(servers)
    print(f"A = {servers[0].tree}, B = {servers[1].tree}; flags: {' '.join(flags)}, --num-threads {args.threads}")
    print(f"load average (1, 5, 15 min) at start {loads[0]}, at end {loads[-1]}; {args.rounds} rounds")
    print(f"  {'median (min-max)':28} {'A':>24} {'B':>24}   B/A")
    a, b = samples["A"], samples["B"]
    for key in a:
        ma, mb = statistics.median(a[key]), statistics.median(b[key])
        cell = lambda m, v: f"{m:8.1f} ({min(v):.1f}-{max(v):.1f})"  # noqa: E731
        print(f"  {key:28} {cell(ma, a[key]):>24} {cell(mb, b[key]):>24}  {mb / ma if ma else 0:5.2f}")
    for label, s in samples.items():
        ratio = statistics.median(s["warm TTFT ms"]) / statistics.median(s["cold TTFT ms"])
        print(f"  {label}: warm / cold {ratio:.3f}")


if __name__ == "__main__":
    main()
