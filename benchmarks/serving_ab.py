"""A/B of two runtime trees over HTTP: both servers up at once, requests alternating between them.

On a shared 2-core host, wall time swings with whatever else runs; two runs minutes apart compare the load, not
the code. This starts `python -m runtime` from tree A and from tree B (each with its own cwd and PYTHONPATH, the
same flags), then alternates workloads between them round by round (A then B, B then A, ...), so the noise hits
both. Workloads are the peers harness's shapes through its client (streamed `/generate`, token ids, greedy,
ignore_eos): single stream = one 128-token prompt, --tokens out, decode tok/s = (n - 1) / (last - first token);
concurrent = --concurrency 128-token prompts at once, --conc-tokens out each, output tokens / wall.

Per workload and server it reads /proc/PID/task/*/schedstat and the engine thread's `nonvoluntary_ctxt_switches`
before and after, and prints medians (and ranges) per output token of: the engine thread's CPU, its time waiting
for a core ("runq"), its involuntary context switches (preempted while runnable: by the woken event loop, its own
OpenMP worker, other processes), its time neither running nor runnable ("blocked": the GIL, or idle between
requests), the event loop thread's CPU and the other threads' CPU (OpenMP workers, to_thread). CPU time and
switch counts move much less with the host's load than tok/s.

    python benchmarks/serving_ab.py --a TREE_A --b TREE_B [--model DIR] [--rounds 6] [--tokens 256]
        [--concurrency 8] [--conc-tokens 128] [--threads 2] [--runtime-arg=FLAG ...] [--env-b KEY=VALUE ...]
        [--runtime-arg-a=FLAG ...] [--runtime-arg-b=FLAG ...]

--env-a / --env-b set environment variables on one side only, --runtime-arg-a / --runtime-arg-b flags (an A/B
of a setting in one tree: `--a . --runtime-arg-b=--engine-process`). With `--engine-process` the engine thread
and "other" threads include the engine process's; "server proc" / "engine proc" CPU split the total by process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))

import engines  # noqa: E402
from clients import RuntimeClient  # noqa: E402
from http_stream import Connections  # noqa: E402

PROMPT = 128


@dataclass
class Server:
    label: str
    tree: Path
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # workload -> metric -> values


def start(label: str, tree: Path, model: Path, threads: int, flags: list[str], env_extra: dict[str, str]) -> Server:
    port = engines.free_port()
    log = Path(tempfile.mkdtemp(prefix=f"serving-ab-{label}-")) / "server.log"
    cmd = [sys.executable, "-m", "runtime", "--model-path", str(model), "--host", "127.0.0.1", "--port", str(port),
           "--num-threads", str(threads), *flags]  # fmt: skip
    env = {**os.environ, **engines.thread_env(threads), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(tree),
           **env_extra}  # fmt: skip
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, cwd=tree, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return Server(label, tree, proc, f"http://127.0.0.1:{port}", log)


def wait_healthy(s: Server, timeout: float = 1800.0) -> None:
    deadline = time.monotonic() + timeout  # a start-up compile on a busy 2-core host takes many minutes
    while time.monotonic() < deadline:
        if s.proc.poll() is not None:
            raise SystemExit(f"server {s.label} exited ({s.proc.returncode}); log {s.log}")
        try:
            if httpx.get(s.url + "/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"server {s.label} not healthy after {timeout:.0f}s; log {s.log}")


def stop(servers: list[Server]) -> None:
    """SIGTERM every server's process group, then SIGKILL what is still up a minute later."""
    for s in servers:
        if s.proc.poll() is None:
            os.killpg(s.proc.pid, signal.SIGTERM)
    for s in servers:
        try:
            s.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(s.proc.pid, signal.SIGKILL)


def process_tree(pid: int) -> list[int]:
    """pid and its descendants (the engine process of `--engine-process`)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo.extend(int(c) for c in task.read_text().split())
            except (OSError, ValueError):
                continue
    return out


def thread_stats(pid: int) -> dict[str, tuple[int, int, int, int]]:
    """tid -> (ns on a CPU, ns runnable waiting for a CPU, involuntary context switches, its process's pid), for
    every thread of the server process and of its child processes."""
    out = {}
    for proc in process_tree(pid):
        for task in Path(f"/proc/{proc}/task").iterdir():
            try:
                cpu, runq = (int(x) for x in (task / "schedstat").read_text().split()[:2])
                status = (task / "status").read_text()
                nvcsw = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
            except (OSError, ValueError, IndexError):
                continue
            out[task.name] = (cpu, runq, nvcsw, proc)
    return out


async def single(url: str, prompt: list[int], n: int) -> tuple[float, int]:
    async with Connections() as http:
        r = await RuntimeClient(url).generate(http, prompt, n)
    return r.decode_tok_s, len(r.output_ids)


async def concurrent(url: str, prompts: list[list[int]], n: int) -> tuple[float, int]:
    async with Connections() as http:
        client = RuntimeClient(url)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(client.generate(http, p, n) for p in prompts))
        wall = time.perf_counter() - t0
    tokens = sum(len(r.output_ids) for r in results)
    return tokens / wall, tokens


def measure(s: Server, workload: str, run: object) -> None:
    pid = s.proc.pid
    before, t0 = thread_stats(pid), time.perf_counter()
    tok_s, tokens = asyncio.run(run)  # type: ignore[arg-type]
    after, wall = thread_stats(pid), time.perf_counter() - t0
    deltas = {tid: tuple(a - b for a, b in zip(after[tid][:3], before[tid][:3], strict=True))
              for tid in after if tid in before}  # fmt: skip
    server_cpu = sum(d[0] for tid, d in deltas.items() if after[tid][3] == pid)
    engine_proc_cpu = sum(d[0] for tid, d in deltas.items() if after[tid][3] != pid)  # --engine-process only
    loop = deltas.pop(str(pid), (0, 0, 0))
    engine_tid = max(deltas, key=lambda t: deltas[t][0])  # the engine thread does most of the work
    engine = deltas.pop(engine_tid)
    rest_cpu = sum(d[0] for d in deltas.values())
    per = s.samples.setdefault(workload, {})
    for key, value in (
        ("tok/s", tok_s),
        ("engine CPU ms", engine[0] / 1e6 / tokens),
        ("engine runq ms", engine[1] / 1e6 / tokens),
        ("engine preempted /tok", engine[2] / tokens),
        ("engine blocked ms", (wall * 1e9 - engine[0] - engine[1]) / 1e6 / tokens),
        ("loop CPU ms", loop[0] / 1e6 / tokens),
        ("other CPU ms", rest_cpu / 1e6 / tokens),
        ("server proc CPU ms", server_cpu / 1e6 / tokens),
        ("engine proc CPU ms", engine_proc_cpu / 1e6 / tokens),
        ("load average (1 min)", os.getloadavg()[0]),
    ):
        per.setdefault(key, []).append(value)


def report(servers: list[Server]) -> None:
    a, b = servers
    for workload in a.samples:
        print(f"\n{workload}: median (min-max) over {len(a.samples[workload]['tok/s'])} rounds")
        print(f"  {'':24} {a.label:>26} {b.label:>26}   B/A")
        for key in a.samples[workload]:
            va, vb = a.samples[workload][key], b.samples[workload][key]
            ma, mb = statistics.median(va), statistics.median(vb)
            cell = lambda m, v: f"{m:8.3f} ({min(v):.3f}-{max(v):.3f})"  # noqa: E731
            ratio = f"{mb / ma:5.2f}" if ma else "  -"
            print(f"  {key:24} {cell(ma, va):>26} {cell(mb, vb):>26}  {ratio}")


def parse_env(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"error: --env-a/--env-b take KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", type=Path, required=True, help="tree A (its runtime/ is served)")
    ap.add_argument("--b", type=Path, default=HERE.parent, help="tree B (default: this script's tree)")
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    ap.add_argument("--model", type=Path, default=engines.WORK / "peer-model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=256, help="single stream: output tokens")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--conc-tokens", type=int, default=128)
    ap.add_argument("--runtime-arg", action="append", default=[], metavar="ARG", help="one more flag, both servers")
    ap.add_argument("--runtime-arg-a", action="append", default=[], metavar="ARG", help="one more flag, A only")
    ap.add_argument("--runtime-arg-b", action="append", default=[], metavar="ARG", help="one more flag, B only")
    ap.add_argument("--env-a", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--env-b", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"error: {args.model} is not a model directory (build it: python benchmarks/peers/run.py)")
    flags_a, flags_b = [*args.runtime_arg, *args.runtime_arg_a], [*args.runtime_arg, *args.runtime_arg_b]
    # One after the other: with --enable-torch-compile the second then finds the first's graphs in inductor's
    # cache instead of compiling them at the same time on the same cores.
    servers = [start(args.label_a, args.a.resolve(), args.model, args.threads, flags_a, parse_env(args.env_a))]
    rng = random.Random(0)
    try:
        wait_healthy(servers[0])
        servers.append(start(args.label_b, args.b.resolve(), args.model, args.threads, flags_b, parse_env(args.env_b)))
        for s in servers:
            wait_healthy(s)
            asyncio.run(single(s.url, [rng.randrange(10, 4000) for _ in range(PROMPT)], 32))  # warm-up
        print(f"load average at start: {os.getloadavg()}")
        for r in range(args.rounds):
            prompt = [rng.randrange(10, 4000) for _ in range(PROMPT)]
            prompts = [[rng.randrange(10, 4000) for _ in range(PROMPT)] for _ in range(args.concurrency)]
            for s in servers if r % 2 == 0 else servers[::-1]:
                # Fresh prompts per round, the same for both servers (each has its own prefix cache).
                measure(s, "single stream", single(s.url, prompt, args.tokens))
                measure(s, f"{args.concurrency} concurrent", concurrent(s.url, prompts, args.conc_tokens))
        print(f"load average at end: {os.getloadavg()}")
    finally:
        stop(servers)
    print(f"A = {servers[0].tree}, B = {servers[1].tree}; flags: {' '.join(args.runtime_arg) or 'default'}, "
          f"--num-threads {args.threads}; A only: {' '.join(args.runtime_arg_a) or '-'}, "
          f"B only: {' '.join(args.runtime_arg_b) or '-'}")  # fmt: skip
    report(servers)


if __name__ == "__main__":
    main()
