"""Where one single-stream decode token's time goes, server included: py-spy on `python -m runtime` + schedstat.

Starts the runtime on loopback with the given flags (default: the default configuration, as `hybridctl launch`
starts it, plus --num-threads), streams one greedy ignore-EOS request (128-token prompt, --tokens out) with the
peers harness's client, and while it decodes:
- samples every server thread with py-spy (`pip install py-spy`; no other dependency) at --rate Hz while it
  is on a core (or runnable; --idle: also while it sleeps, e.g. waiting for the GIL), native frames with
  --native (splits the forward into matmul kernels and the rest);
- reads /proc/PID/task/*/schedstat before and after: each thread's CPU, the engine thread's wait for a core, and
  its wall time neither on a core nor waiting for one (blocked: the GIL, while tokens stream).
Then prints the share of the engine thread's wall time per category (model forward, its matmul kernels with
--native, sampling, scheduler, emitting outputs, idle/waiting), the event loop thread's (HTTP/uvicorn/asyncio,
our server code, detokenizing, idle), and ms per token.

    python benchmarks/decode_profile.py [--model DIR] [--threads 2] [--tokens 1024] [--rate 250] [--native]
        [--runtime-arg=--enable-torch-compile ...] [--raw FILE]

The model defaults to the peers harness's (benchmarks/peers/.work/peer-model, built if missing).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))
sys.path.insert(1, str(HERE.parent))

import engines  # noqa: E402
from clients import RuntimeClient  # noqa: E402
from http_stream import Connections  # noqa: E402

PROMPT = 128

# (category, substrings of a frame; the first category any frame of a stack matches, leaf to root, wins)
ENGINE_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("idle (waiting for work)", ("queue.py", "threading.py")),
    ("sampling", ("scheduler/sampling.py",)),
    ("emit outputs / wake the loop", ("server/engine_bridge.py", "call_soon_threadsafe")),
    ("detokenize / stop check", ("tokenizers", "tokenizer.py", "scheduler/stopping.py")),
    ("model forward", ("runtime/models/", "_inductor", "compiled_decode.py", "compile_support.py", "torch/")),
    ("scheduler (batch, pools, bookkeeping)", ("runtime/scheduler/", "runtime/kvcache/", "runtime/core/")),
    ("engine loop (step, stats, listeners)", ("runtime/engine/",)),
)
LOOP_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("detokenize", ("tokenizers", "server/tokenizer.py", "decode (")),
    ("server code (request state, chunks, SSE)", ("runtime/server/",)),
    ("HTTP / ASGI (uvicorn, h11, starlette)", ("uvicorn", "h11", "starlette", "fastapi", "anyio")),
    ("event loop (asyncio / uvloop)", ("asyncio", "uvloop", "selectors.py")),
)
MATMUL = ("gemm", "mkl_", "dnnl", "addmm", "::mm", "bmm", "matmul", "linear", "sgemv", "dot_")


def categorize(stack: list[str], rules: tuple[tuple[str, tuple[str, ...]], ...]) -> str:
    for frame in reversed(stack):
        for name, keys in rules:
            if any(k in frame for k in keys):
                return name
    return "other"


def schedstat(pid: int) -> dict[str, tuple[str, int, int]]:
    """tid -> (thread name, ns on a CPU, ns runnable but waiting for a CPU)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            cpu, runq = (task / "schedstat").read_text().split()[:2]
            out[task.name] = ((task / "comm").read_text().strip(), int(cpu), int(runq))
        except (OSError, ValueError):
            continue
    return out


def vm_mib(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_server(
    model: Path, threads: int, extra: list[str], a_timeout: float = 1800.0
) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = engines.free_port()
    log = Path(tempfile.mkdtemp(prefix="decode-profile-")) / "server.log"
    cmd = [sys.executable, "-m", "runtime", "--model-path", str(model), "--host", "127.0.0.1", "--port", str(port),
           "--num-threads", str(threads), *extra]  # fmt: skip
    env = {**os.environ, **engines.thread_env(threads), "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + a_timeout  # a compile on a busy 2-core host takes 10-20 min
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}); log {log}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url, log
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(f"server not healthy after {a_timeout:.0f}s; log {log}")


async def stream(url: str, prompt: list[int], n: int) -> tuple[float, int]:
    """(decode tok/s = (n - 1) / (last - first token), tokens)."""
    async with Connections() as http:
        r = await RuntimeClient(url).generate(http, prompt, n)
    return r.decode_tok_s, len(r.output_ids)


def profile(a: argparse.Namespace, model: Path) -> None:
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("error: needs py-spy on PATH (pip install py-spy)")
    proc, url, log = start_server(model, a.threads, a.runtime_arg)
    rng = random.Random(0)
    try:
        time.sleep(2.0)
        idle_rss = vm_mib(proc.pid, "VmRSS")
        asyncio.run(stream(url, [rng.randrange(10, 4000) for _ in range(PROMPT)], 32))  # warm-up
        raw = a.raw or Path(tempfile.mkdtemp(prefix="decode-profile-")) / "stacks.txt"
        cmd = [spy, "record", "--pid", str(proc.pid), "--rate", str(a.rate), "--format", "raw", "--threads",
               "-o", str(raw)]  # fmt: skip
        # --native pauses the process per sample (py-spy refuses --nonblocking with it); without it, no pauses.
        cmd += (["--native"] if a.native else ["--nonblocking"]) + (["--idle"] if a.idle else [])
        spy_log = raw.with_suffix(".py-spy.log")
        sampler = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(spy_log, "wb"))  # noqa: SIM115
        time.sleep(1.0)  # py-spy attaches
        before, t0 = schedstat(proc.pid), time.perf_counter()
        tok_s, tokens = asyncio.run(stream(url, [rng.randrange(10, 4000) for _ in range(PROMPT)], a.tokens))
        after, wall = schedstat(proc.pid), time.perf_counter() - t0
        peak_rss = vm_mib(proc.pid, "VmHWM")
        sampler.send_signal(signal.SIGINT)
        sampler.wait(timeout=60)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    print(f"server: {' '.join(a.runtime_arg) or 'default flags'}, --num-threads {a.threads}; log {log}")
    print(f"resident memory: idle {idle_rss:.0f} MiB, peak {peak_rss:.0f} MiB (VmRSS / VmHWM of the server)")
    print(f"single stream: {tokens} tokens, decode {tok_s:.1f} tok/s ({1000 / tok_s:.2f} ms/token); stacks {raw}")
    report_schedstat(before, after, wall, tokens, proc.pid)
    if not raw.is_file():
        raise SystemExit(f"py-spy wrote nothing; its log: {spy_log}")
    report_stacks(raw)


def report_schedstat(before: dict, after: dict, wall: float, tokens: int, pid: int) -> None:
    rows = []
    for tid, (name, cpu, runq) in after.items():
        if tid not in before:
            continue
        dc, dq = cpu - before[tid][1], runq - before[tid][2]
        if dc > 1e6:
            role = "event loop (main)" if tid == str(pid) else name
            blocked = wall * 1e9 - dc - dq
            rows.append((dc, f"  {role:24} CPU {dc / 1e6 / tokens:6.3f}  waiting for a core {dq / 1e6 / tokens:6.3f}"
                              f"  blocked (GIL / sleep) {blocked / 1e6 / tokens:6.3f}"))  # fmt: skip
    print(f"per thread, ms per token over the request ({wall * 1000 / tokens:.2f} ms wall per token):")
    for _, row in sorted(rows, reverse=True):
        print(row)


def report_stacks(raw: Path) -> None:
    per: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    matmul: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack_text, _, count = line.rpartition(" ")
        frames = stack_text.split(";")
        thread, stack = frames[0], frames[1:]
        if "runtime-engine" in thread:
            cat = categorize(stack, ENGINE_RULES)
            per["engine thread"][cat] += int(count)
            if cat == "model forward":
                matmul["matmul kernels" if any(any(k in f for k in MATMUL) for f in stack) else "rest"] += int(count)
        elif "MainThread" in thread or "main" in thread.lower():
            idle = not stack or any("run_forever" in f or "run_until_complete" in f for f in stack[-2:])
            per["event loop thread"]["idle" if idle else categorize(stack, LOOP_RULES)] += int(count)
    for thread, counts in per.items():
        total = sum(counts.values()) or 1
        print(f"{thread}: {total} samples")
        for cat, c in counts.most_common():
            print(f"  {c / total:6.1%}  {cat}")
            if cat == "model forward" and sum(matmul.values()) and any(matmul[k] for k in ("matmul kernels",)):
                for sub, s in matmul.most_common():
                    print(f"           {s / total:6.1%}  of which {sub}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="model directory (default: the peers harness's peer model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--native", action="store_true", help="py-spy --native (C/C++ frames: matmul kernels)")
    ap.add_argument("--idle", action="store_true", help="py-spy --idle: also sample threads that wait (GIL, queue)")
    ap.add_argument("--raw", type=Path, help="keep py-spy's collapsed stacks here")
    ap.add_argument("--runtime-arg", action="append", default=[], metavar="ARG", help="one more server flag")
    a = ap.parse_args()
    from peer_model import peer_model_dir

    model = peer_model_dir(a.model)
    profile(a, model)


if __name__ == "__main__":
    main()
