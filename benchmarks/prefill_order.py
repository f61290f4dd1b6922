"""Served TTFT of prompts that arrive together, and of one cold prompt, with the runtime's prefill-step settings
side by side: the peers harness's shared-prefix workload (4 system prompts x 4 questions, 512 + 64 tokens, 32 out,
8 in flight: mean TTFT) and its cold 2048-token prompt (TTFT).

Starts one `python -m runtime` per configuration (all up at once, on loopback, the peers harness's launch and
model: benchmarks/peers/engines.py), then runs both workloads on each in turn, repetition by repetition, the order
rotating, so a slow minute of a shared host lands on every configuration alike. Configurations:

- default: the runtime's CPU defaults (`--max-prefill-tokens 128`: prompts that arrive together are prefilled one
  after another; `--decoding-step-tokens auto`);
- batched: `--max-prefill-tokens 16384 --decoding-step-tokens 256` (every waiting prompt in one prefill step, and
  a fixed cap while requests decode: the runtime's behaviour before those defaults);
- batched-auto: `--max-prefill-tokens 16384` alone (every waiting prompt in one step, the time-target cap);
- default-256: `--decoding-step-tokens 256` alone (one prompt per step, the fixed cap);
- lpm: the default with `--schedule-policy lpm` (prompts whose prefix is cached first).

    python benchmarks/prefill_order.py [--model DIR] [--reps 5] [--threads 2] [--configs default,batched,lpm]
        [--json OUT]

Prints per configuration the median (and range) over the repetitions, with the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))
sys.path.insert(1, str(HERE.parent))

import engines  # noqa: E402
from clients import EngineClient  # noqa: E402
from http_stream import Connections  # noqa: E402
from peer_model import peer_model_dir  # noqa: E402
from workloads import GSP_CONCURRENCY, GSP_SHAPE, Prompts, build_prompts  # noqa: E402

CONFIGS = {
    "default": [],
    "batched": ["--max-prefill-tokens", "16384", "--decoding-step-tokens", "256"],
    "batched-auto": ["--max-prefill-tokens", "16384"],
    "default-256": ["--decoding-step-tokens", "256"],
    "lpm": ["--schedule-policy", "lpm"],
}


async def shared_prefix_mean_ttft_ms(client: EngineClient, prompts: list[list[int]]) -> float:
    gate = asyncio.Semaphore(GSP_CONCURRENCY)
    async with Connections() as http:

        async def one(ids: list[int]) -> float:
            async with gate:
                return (await client.generate(http, ids, GSP_SHAPE.output_len)).ttft_s

        ttfts = await asyncio.gather(*(one(p) for p in prompts))
    return 1000 * statistics.mean(ttfts)


async def cold_ttft_ms(client: EngineClient, ids: list[int]) -> float:
    async with Connections() as http:
        return 1000 * (await client.generate(http, ids, 8)).ttft_s


async def run(clients: dict[str, EngineClient], reps: int, vocab: int, first_id: int) -> dict[str, dict[str, list]]:
    samples: dict[str, dict[str, list[float]]] = {name: {"gsp": [], "cold": []} for name in clients}
    warm = build_prompts(vocab, first_id, 1, seed=1000)
    for client in clients.values():  # first-use costs (thread choosers' probes, allocator growth) stay out
        await cold_ttft_ms(client, warm.warmup)
        await shared_prefix_mean_ttft_ms(client, warm.gsp)
    names = list(clients)
    for rep in range(reps):
        prompts: Prompts = build_prompts(vocab, first_id, 1, seed=rep)
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            gsp = await shared_prefix_mean_ttft_ms(clients[name], prompts.gsp)
            cold = await cold_ttft_ms(clients[name], prompts.cold[0])
            samples[name]["gsp"].append(gsp)
            samples[name]["cold"].append(cold)
            print(f"[{name}] rep {rep}: shared-prefix mean TTFT {gsp:.0f} ms, cold TTFT {cold:.0f} ms", flush=True)
    return samples


def _cell(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{med:.0f} ({min(values):.0f}-{max(values):.0f})" if len(values) > 1 else f"{med:.0f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="model directory (default: the peers harness's model)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    if not names or any(n not in CONFIGS for n in names):
        p.error(f"--configs: choose from {', '.join(CONFIGS)}")
    model = peer_model_dir(args.model)
    config = json.loads((model / "config.json").read_text())
    first_id = max(config.get("bos_token_id") or 0, config.get("eos_token_id") or 0) + 1
    load_before = os.getloadavg()
    running: dict[str, engines.Running] = {}
    clients: dict[str, EngineClient] = {}
    try:
        for name in names:
            engines.RUNTIME_EXTRA_ARGS = CONFIGS[name]
            launch = engines.runtime_launch(model, args.threads, engines.free_port())
            print(f"[{name}] starting: {' '.join(launch.cmd[2:])}", flush=True)
            running[name] = engines.start(launch, engines.WORK / "logs" / f"prefill-order-{name}.log", args.threads)
            clients[name] = launch.client
        samples = asyncio.run(run(clients, args.reps, int(config["vocab_size"]), first_id))
    finally:
        for r in running.values():
            engines.stop(r)
    print(f"\nmodel {model}, {args.threads} threads, {args.reps} reps; load average {load_before} -> {os.getloadavg()}")
    print("| row | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    print("| shared-prefix 4x4: mean TTFT (ms) | " + " | ".join(_cell(samples[n]["gsp"]) for n in names) + " |")
    print("| cold TTFT, 2048-token prompt (ms) | " + " | ".join(_cell(samples[n]["cold"]) for n in names) + " |")
    if args.json is not None:
        args.json.write_text(json.dumps({"load": [load_before, os.getloadavg()], "samples": samples}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
