"""Where the wall time of N concurrent streamed requests goes, step by step: a served timeline of the engine thread.

Starts `python -m runtime` from this tree through this script (`--serve`), which times every `ModelRunner.run`
(wall and the engine thread's CPU, mode, sequences, tokens) and writes them at exit; then sends `--rounds` rounds
of `--concurrency` fresh prompts of 128 tokens, `--tokens` out each, through the peers harness's client (streamed
`/generate`, greedy, ignore_eos), as `benchmarks/peers/` does. Per round it prints: output tok/s, the requests'
TTFTs, every prefill forward (sequences, tokens, start after the round began, wall ms, CPU ms), how many decode steps
ran at each batch size, and for the full-batch decode steps the median forward wall / CPU and the median gap between
one forward's end and the next one's start (the engine thread's host work: sample, emit, stats, schedule, prepare,
plus any wait for the GIL or a core), with the load average.

    python benchmarks/concurrent_timeline.py [--model DIR] [--rounds 4] [--concurrency 8] [--tokens 128]
        [--threads 2] [--env KEY=VALUE ...] [--runtime-arg=FLAG ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROMPT = 128
TRACE_ENV = "CONCURRENT_TIMELINE_TRACE"


def serve(argv: list[str]) -> None:
    """`python -m runtime ARGV` with ModelRunner.run timed; the records go to $CONCURRENT_TIMELINE_TRACE at exit."""
    import atexit
    import runpy

    from runtime.engine import model_runner

    records: list[tuple[float, float, float, str, int, int]] = []
    run = model_runner.ModelRunner.run

    def timed(self: Any, batch: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        out = run(self, batch)
        tokens = sum(len(t) for t in batch.tokens)
        records.append((t0, time.perf_counter(), time.thread_time() - c0, batch.mode, len(batch.reqs), tokens))
        return out

    model_runner.ModelRunner.run = timed  # type: ignore[method-assign]
    atexit.register(lambda: Path(os.environ[TRACE_ENV]).write_text(json.dumps(records)))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.argv = ["runtime", *argv]
    runpy.run_module("runtime", run_name="__main__")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(trace: list[list[Any]], rounds: list[tuple[float, float, list[float]]], concurrency: int) -> None:
    for i, (t0, t1, ttfts) in enumerate(rounds):
        fwd = [r for r in trace if t0 <= r[0] <= t1]
        prefills = [f"{n} seq / {tok} tok at {(s - t0) * 1e3:.0f}: {(e - s) * 1e3:.0f} wall {c * 1e3:.0f} cpu"
                    for s, e, c, mode, n, tok in fwd if mode == "extend"]  # fmt: skip
        decode = [r for r in fwd if r[3] == "decode"]
        full = [r for r in decode if r[4] == concurrency]
        gaps = [b[0] - a[1] for a, b in zip(full, full[1:], strict=False)]
        sizes = sorted(Counter(r[4] for r in decode).items())
        print(f"  round {i}: TTFT ms {[round(t * 1e3) for t in sorted(ttfts)]}")
        print(f"    prefills (ms): {prefills}")
        print(f"    decode steps by batch size: {sizes}; batch {concurrency}: forward wall "
              f"{_median([(e - s) * 1e3 for s, e, *_ in full]):.2f} ms, CPU {_median([r[2] * 1e3 for r in full]):.2f}, "
              f"gap to the next forward {_median([g * 1e3 for g in gaps]):.2f}; "
              f"{sum(e - s for s, e, *_ in full) * 1e3:.0f} ms in {len(full)} forwards")  # fmt: skip


async def _round(url: str, prompts: list[list[int]], tokens: int) -> tuple[list[Any], float]:
    from clients import RuntimeClient
    from http_stream import Connections

    async with Connections() as http:
        client, t0 = RuntimeClient(url), time.perf_counter()
        results = await asyncio.gather(*(client.generate(http, p, tokens) for p in prompts))
        return results, time.perf_counter() - t0


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2:])
        return
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE / "peers"))
    import engines
    import serving_ab

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=engines.WORK / "peer-model")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="server environment")
    ap.add_argument("--runtime-arg", action="append", default=[], metavar="ARG", help="one more server flag")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="concurrent-timeline-"))
    trace_file, log = work / "trace.json", work / "server.log"
    port = engines.free_port()
    env = {**os.environ, **engines.thread_env(args.threads), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(HERE.parent),
           TRACE_ENV: str(trace_file), **serving_ab.parse_env(args.env)}  # fmt: skip
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", "--model-path", str(args.model), "--host",
           "127.0.0.1", "--port", str(port), "--num-threads", str(args.threads), *args.runtime_arg]  # fmt: skip
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            cmd, cwd=HERE.parent, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = serving_ab.Server("timeline", HERE.parent, proc, f"http://127.0.0.1:{port}", log)
    rounds: list[tuple[float, float, list[float]]] = []
    rng = random.Random(0)
    try:
        serving_ab.wait_healthy(server)
        print(f"load average at start: {os.getloadavg()}")
        for _ in range(args.rounds):
            prompts = [[rng.randrange(10, 4000) for _ in range(PROMPT)] for _ in range(args.concurrency)]
            t0 = time.perf_counter()
            results, wall = asyncio.run(_round(server.url, prompts, args.tokens))
            out = sum(len(r.output_ids) for r in results)
            rounds.append((t0, t0 + wall, [r.ttft_s for r in results]))
            print(f"round {len(rounds) - 1}: {out / wall:.1f} output tok/s, {wall * 1e3:.0f} ms, "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    finally:
        serving_ab.stop([server])
    report(json.loads(trace_file.read_text()), rounds, args.concurrency)
    print(f"load average at end: {os.getloadavg()}; server log {log}")


if __name__ == "__main__":
    main()
