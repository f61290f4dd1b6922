"""What the HTTP server adds on top of the engine: the same workloads over streamed /generate and in-process.

One run, same prompts, same thread count, one after the other (never at once: the machine has few cores):

1. HTTP: `python -m runtime` on loopback (as benchmarks/peers starts it), driven by the peers harness's
   `RuntimeClient` (streamed `POST /generate` with token ids, greedy, ignore_eos).
2. Engine: `EngineCore.step()` in this process, no server (benchmarks/runtime_throughput.py's loop).

Workloads (benchmarks/peers/workloads.py's shapes): single stream = one 128-token prompt, 128 new tokens,
decode tok/s = (n - 1) / (finish - first token); 8 concurrent = eight 128-token prompts at once, 128 new tokens
each, output tokens / wall. Prints medians over --repeats and HTTP / engine, and ms per output token: CPU of the
server's event-loop thread ("loop CPU") and of its other threads ("rest CPU": engine loop, torch workers), the
in-process engine's CPU (time.process_time), "extra" = loop + rest - engine (what serving costs in CPU), the
server's engine thread waiting for a core ("eng. runq"; the cores are shared with the event loop, the client and
whatever else runs; "(in-proc)": the same for the in-process engine), and the engine thread neither running nor
waiting for a core ("eng. blocked": waiting for the GIL the event loop holds), from /proc/PID/task/*/schedstat.
CPU and blocked time, unlike tok/s, barely move when other processes share the cores.

`--py-spy FILE` also samples the server during the HTTP workloads with py-spy (`pip install py-spy`; `--gil`:
only the thread holding the GIL) and writes its collapsed stacks to FILE, then prints the top functions by own
time, per thread.

Both halves run in the runtime's default configuration, as the peers harness does, or with --enable-torch-compile
with --compile (the harness's --runtime-compile).

    python benchmarks/server_overhead.py [--model DIR] [--threads 2] [--repeats 3] [--compile] [--stream-interval N]
        [--skip-engine] [--py-spy FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import runtime  # noqa: F401 - before torch: sets OpenMP's wait policy as the server does

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "peers"), str(HERE)]

import engines  # noqa: E402
from clients import RuntimeClient  # noqa: E402
from engines import free_port, runtime_launch, start, stop  # noqa: E402
from http_stream import Connections  # noqa: E402

VOCAB = 4000  # below the demo tokenizer's special tokens
PROMPT, OUT, CONC = 128, 128, 8


def prompts(seed: int) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """(single prompt, concurrent prompts, warm-up prompts); the same in both halves of the run."""
    rng = random.Random(seed)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(VOCAB) for _ in range(n)]

    return fresh(PROMPT), [fresh(PROMPT) for _ in range(CONC)], [fresh(64) for _ in range(CONC)]


@dataclass
class ThreadTimes:
    """Per thread of a process: (ns on CPU, ns runnable but waiting for a CPU), from /proc/PID/task/*/schedstat."""

    pid: int
    wall: float = field(default_factory=time.perf_counter)
    tasks: dict[str, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                cpu, runq = (task / "schedstat").read_text().split()[:2]
            except (OSError, ValueError):
                continue  # a thread that ended in between
            self.tasks[task.name] = (int(cpu), int(runq))


def thread_costs(
    a: ThreadTimes, b: ThreadTimes, tokens: int, main_is_engine: bool = False
) -> tuple[float, float, float, float]:
    """ms per token between two snapshots: (main thread CPU, other threads' CPU, engine thread waiting for a
    core, engine thread blocked).

    In the server, the main thread runs only the event loop (HTTP, detokenizing, chunk encoding); the engine loop and
    torch's workers are the other threads. The engine thread is the busiest of those; "blocked" is its wall time
    neither on a CPU nor waiting for one: while requests stream, that is waiting for the GIL.
    """
    deltas = {t: (b.tasks[t][0] - c, b.tasks[t][1] - q) for t, (c, q) in a.tasks.items() if t in b.tasks}
    main_cpu, main_runq = deltas.pop(str(a.pid), (0, 0))
    rest = sum(c for c, _ in deltas.values())
    # In-process (main_is_engine) the steps run on the main thread itself.
    cpu, runq = (main_cpu, main_runq) if main_is_engine else max(deltas.values(), default=(0, 0))
    main = main_cpu
    blocked = max(0.0, (b.wall - a.wall) * 1e9 - cpu - runq)
    return main / 1e6 / tokens, rest / 1e6 / tokens, runq / 1e6 / tokens, blocked / 1e6 / tokens


@dataclass
class Samples:
    """Per repeat, for each workload: tok/s (wall) and ms per output token (see `thread_costs`)."""

    single: list[float] = field(default_factory=list)
    conc: list[float] = field(default_factory=list)
    single_cpu: list[float] = field(default_factory=list)  # HTTP: threads other than main; engine: process
    conc_cpu: list[float] = field(default_factory=list)
    single_main: list[float] = field(default_factory=list)  # HTTP only: the event loop's thread
    conc_main: list[float] = field(default_factory=list)
    single_blocked: list[float] = field(default_factory=list)  # HTTP only: the engine thread waiting (GIL)
    conc_blocked: list[float] = field(default_factory=list)
    single_runq: list[float] = field(default_factory=list)  # the engine's thread waiting for a core
    conc_runq: list[float] = field(default_factory=list)


async def http_run(
    client: RuntimeClient,
    pid: int,
    single: list[int],
    conc: list[list[int]],
    warm: list[list[int]],
    repeats: int,
) -> tuple[Samples, list[list[int]]]:
    s, outputs = Samples(), []
    async with Connections() as http:
        await asyncio.gather(*(client.generate(http, p, 16) for p in warm))
        for _ in range(repeats):
            t0 = ThreadTimes(pid)
            r = await client.generate(http, single, OUT)
            main, rest, runq, blocked = thread_costs(t0, ThreadTimes(pid), len(r.output_ids))
            s.single_runq.append(runq)
            s.single_main.append(main)
            s.single_cpu.append(rest)
            s.single_blocked.append(blocked)
            s.single.append(r.decode_tok_s)
            outputs.append(r.output_ids)
            t0 = ThreadTimes(pid)
            results = await asyncio.gather(*(client.generate(http, p, OUT) for p in conc))
            n = sum(len(x.output_ids) for x in results)
            t1 = ThreadTimes(pid)
            s.conc.append(n / (t1.wall - t0.wall))
            main, rest, runq, blocked = thread_costs(t0, t1, n)
            s.conc_runq.append(runq)
            s.conc_main.append(main)
            s.conc_cpu.append(rest)
            s.conc_blocked.append(blocked)
    return s, outputs


def engine_run(
    model: Path,
    threads: int,
    single: list[int],
    conc: list[list[int]],
    warm: list[list[int]],
    repeats: int,
    compile_decode: bool,
) -> Samples:
    import torch
    from runtime_throughput import run_requests

    from runtime.core.config import EngineArgs
    from runtime.engine.engine_core import EngineCore

    torch.set_num_threads(threads)
    extra = {"enable_torch_compile": True} if compile_decode else {}  # as the server was started
    core = EngineCore(EngineArgs(model_path=str(model), memory_budget_gib=2, **extra))
    run_requests(core, warm, 16, "warm")
    s = Samples()
    for rep in range(repeats):
        c0, t0 = time.process_time(), ThreadTimes(os.getpid())
        r = run_requests(core, [single], OUT, f"s{rep}")
        s.single_runq.append(thread_costs(t0, ThreadTimes(os.getpid()), int(r["tokens"]), main_is_engine=True)[2])
        s.single_cpu.append((time.process_time() - c0) * 1000 / r["tokens"])
        s.single.append((r["tokens"] - 1) / (r["last"] - r["first"]))
        c0, t0 = time.process_time(), ThreadTimes(os.getpid())
        r = run_requests(core, conc, OUT, f"c{rep}")
        s.conc_runq.append(thread_costs(t0, ThreadTimes(os.getpid()), int(r["tokens"]), main_is_engine=True)[2])
        s.conc_cpu.append((time.process_time() - c0) * 1000 / r["tokens"])
        s.conc.append(r["tokens"] / r["wall"])
    return s


def top_functions(collapsed: Path, n: int = 25) -> str:
    """Own-time share per (thread, function) from py-spy's collapsed stacks ("a;b;c count" lines)."""
    own: collections.Counter[tuple[str, str]] = collections.Counter()
    per_thread: collections.Counter[str] = collections.Counter()
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        thread = frames[0]
        per_thread[thread] += int(count)
        own[(thread, frames[-1])] += int(count)
    total = sum(per_thread.values()) or 1
    rows = [f"{c / total:6.1%}  {t[:28]:28}  {f}" for (t, f), c in own.most_common(n)]
    threads = ", ".join(f"{t}: {c / total:.0%}" for t, c in per_thread.most_common())
    return f"samples per thread: {threads}\n" + "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="model directory (default: build the demo model in a temp dir)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--py-spy", type=Path, metavar="FILE", help="sample the server with py-spy into FILE")
    ap.add_argument("--skip-engine", action="store_true", help="HTTP half only (e.g. while profiling)")
    ap.add_argument(
        "--compile", action="store_true", help="--enable-torch-compile on both halves (the harness's --runtime-compile)"
    )
    ap.add_argument("--stream-interval", type=int, default=1, help="sampling_params.stream_interval of the HTTP half")
    a = ap.parse_args()
    engines.RUNTIME_COMPILE = a.compile
    if a.model is None:
        from runtime.demo_model import build_demo_model

        a.model = build_demo_model(Path(tempfile.mkdtemp()) / "demo")
    single, conc, warm = prompts(0)

    launch = runtime_launch(a.model, a.threads, free_port())
    if a.stream_interval != 1:
        launch.client.extra_sampling["stream_interval"] = a.stream_interval  # type: ignore[attr-defined]
    logs = Path(tempfile.mkdtemp())
    running = start(launch, logs / "runtime.log", a.threads)
    spy = None
    try:
        if a.py_spy is not None:
            exe = shutil.which("py-spy")
            if exe is None:
                raise SystemExit("error: --py-spy needs py-spy on PATH (pip install py-spy)")
            spy = subprocess.Popen(
                [exe, "record", "--pid", str(running.process.pid), "--format", "raw", "--threads",
                 "--rate", "500", "--gil", "--nonblocking", "-o", str(a.py_spy)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(1.0)
        pid = running.process.pid
        h, outputs = asyncio.run(http_run(launch.client, pid, single, conc, warm, a.repeats))  # type: ignore[arg-type]
    finally:
        if spy is not None:
            spy.send_signal(2)  # py-spy writes its file on SIGINT
            spy.wait(timeout=60)
        stop(running)
    assert all(o == outputs[0] for o in outputs), "greedy outputs differ between repeats"
    print(f"model={a.model} threads={a.threads} repeats={a.repeats} compile={engines.RUNTIME_COMPILE} (medians)")
    print(f"{'':22}{'HTTP tok/s':>11}{'engine':>8}{'ratio':>7}  | ms/token: {'loop CPU':>9}{'rest CPU':>9}"
          f"{'engine CPU':>11}{'extra':>7}{'eng. runq':>10}{'(in-proc)':>10}{'eng. blocked':>13}")  # fmt: skip
    compiled = engines.RUNTIME_COMPILE
    e = Samples() if a.skip_engine else engine_run(a.model, a.threads, single, conc, warm, a.repeats, compiled)
    med = statistics.median
    for name, hw, ew, hm, hc, ec, hq, eq, hb in (
        ("single stream", h.single, e.single, h.single_main, h.single_cpu, e.single_cpu, h.single_runq,
         e.single_runq, h.single_blocked),
        (f"{CONC} concurrent x {OUT}", h.conc, e.conc, h.conc_main, h.conc_cpu, e.conc_cpu, h.conc_runq,
         e.conc_runq, h.conc_blocked),
    ):  # fmt: skip
        ratio = f"{med(ew):8.1f}{med(hw) / med(ew):7.2f}" if ew else f"{'':15}"
        extra = f"{med(ec):11.2f}{med(hm) + med(hc) - med(ec):7.2f}" if ec else f"{'':18}"
        waits = f"{med(hq):10.3f}{med(eq) if eq else float('nan'):10.3f}{med(hb):13.3f}"
        print(f"{name:22}{med(hw):11.1f}{ratio}  | {'':10}{med(hm):9.3f}{med(hc):9.2f}{extra}{waits}")
    if a.py_spy is not None and a.py_spy.is_file():
        print(top_functions(a.py_spy))


if __name__ == "__main__":
    main()
