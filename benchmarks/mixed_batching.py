"""Mixed batching on a live server: how long a decoding stream pauses while an 8000-token prompt is prefilled, and
the throughput of long prompts arriving while short ones decode, with the runtime's scheduling configurations side
by side.

Starts one `python -m runtime` per configuration (all up at once, on loopback, the peers harness's launch and
model: benchmarks/peers/engines.py, peer_model.py), then runs the engine-agnostic workloads of
benchmarks/peers/mixed_workload.py on each in turn, repetition by repetition, the order rotating, so a slow minute
of a shared host lands on every configuration alike. Configurations:

- mixed: the default (decode rows ride in every prefill step; while requests decode a step computes at most the
  tokens that keep it within --decode-pause-target-ms, from measured step times: --decoding-step-tokens auto);
- mixed-256: the same with a fixed cap of 256 tokens (--decoding-step-tokens 256);
- alternating: --disable-mixed-chunk (prefill and decode steps take turns, under the default cap);
- uncapped: --disable-mixed-chunk --decoding-step-tokens -1 (a prompt arriving while others decode is prefilled in
  chunks of --chunked-prefill-size, 8192, each followed by one decode step).

    python benchmarks/mixed_batching.py [--model DIR] [--reps 3] [--threads 2]
        [--configs mixed,mixed-256,alternating,uncapped]
        [--json OUT] [--runtime-arg=FLAG ...]

Prints per configuration the median (and range) over the repetitions, with the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))
sys.path.insert(1, str(HERE.parent))

import engines  # noqa: E402
from clients import EngineClient  # noqa: E402
from http_stream import Connections  # noqa: E402
from mixed_workload import (  # noqa: E402
    LONG_PROMPT,
    MixedPrompts,
    PauseSample,
    build_mixed_prompts,
    decode_pause,
    mixed_throughput,
)
from peer_model import peer_model_dir  # noqa: E402

CONFIGS = {
    "mixed": [],
    "mixed-256": ["--decoding-step-tokens", "256"],
    "alternating": ["--disable-mixed-chunk"],
    "uncapped": ["--disable-mixed-chunk", "--decoding-step-tokens", "-1"],
}


async def warm_up(client: EngineClient, prompts: MixedPrompts) -> None:
    """First-use costs (thread choosers' probes, allocator growth, kernel builds) stay out of the numbers."""
    async with Connections() as http:
        await client.generate(http, prompts.long[:2048], 2)
        await decode_pause(client, http, prompts)


async def run(
    clients: dict[str, EngineClient], reps: int, vocab: int, first_id: int
) -> dict[str, dict[str, list[Any]]]:
    samples: dict[str, dict[str, list[Any]]] = {name: {"pause": [], "mixed": []} for name in clients}
    for name, client in clients.items():
        await warm_up(client, build_mixed_prompts(vocab, first_id, seed=1000))
        print(f"[{name}] warmed up", flush=True)
    names = list(clients)
    for rep in range(reps):
        prompts = build_mixed_prompts(vocab, first_id, seed=rep)
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            async with Connections() as http:
                pause = await decode_pause(clients[name], http, prompts)
            mixed = await mixed_throughput(clients[name], prompts)
            samples[name]["pause"].append(pause)
            samples[name]["mixed"].append(mixed)
            print(f"[{name}] rep {rep}: {pause}; {mixed}", flush=True)
    return samples


def _cell(values: list[float], fmt: str = ".0f") -> str:
    med = statistics.median(values)
    return f"{med:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})" if len(values) > 1 else f"{med:{fmt}}"


def table(samples: dict[str, dict[str, list[Any]]]) -> str:
    rows = [
        ("longest decode gap during an 8000-token prefill (ms)", "pause", "longest_gap_ms", ".0f"),
        ("8000-token prompt TTFT (ms)", "pause", "long_ttft_ms", ".0f"),
        ("stream's median inter-token gap (ms)", "pause", "median_gap_ms", ".1f"),
        ("mixed workload: output tok/s", "mixed", "out_tok_s", ".1f"),
        ("mixed workload: longest decode gap (ms)", "mixed", "longest_gap_ms", ".0f"),
        ("mixed workload: long prompts' mean TTFT (ms)", "mixed", "long_mean_ttft_ms", ".0f"),
    ]
    names = list(samples)
    lines = ["| row | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, workload, key, fmt in rows:
        cells = [_cell([getattr(s, key) for s in samples[n][workload]], fmt) for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="model directory (default: the peers harness's model)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--runtime-arg", action="append", default=[], metavar="ARG", help="one more flag, every config")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    if not names or any(n not in CONFIGS for n in names):
        p.error(f"--configs: choose from {', '.join(CONFIGS)}")
    model = peer_model_dir(args.model)
    config = json.loads((model / "config.json").read_text())
    first_id = max(config.get("bos_token_id") or 0, config.get("eos_token_id") or 0) + 1
    if int(config.get("max_position_embeddings", 0)) <= LONG_PROMPT:
        p.error(f"{model}: max_position_embeddings must exceed the {LONG_PROMPT}-token prompt")
    load_before = os.getloadavg()
    running: dict[str, engines.Running] = {}
    clients: dict[str, EngineClient] = {}
    try:
        for name in names:
            engines.RUNTIME_EXTRA_ARGS = CONFIGS[name] + list(args.runtime_arg)
            launch = engines.runtime_launch(model, args.threads, engines.free_port())
            print(f"[{name}] starting: {' '.join(launch.cmd[2:])}", flush=True)
            running[name] = engines.start(launch, engines.WORK / "logs" / f"mixed-{name}.log", args.threads)
            clients[name] = launch.client
        samples = asyncio.run(run(clients, args.reps, int(config["vocab_size"]), first_id))
    finally:
        for r in running.values():
            engines.stop(r)
    uncovered = [n for n, s in samples.items() for x in s["pause"] if not isinstance(x, PauseSample) or not x.covered]
    print(f"\nmodel {model}, {args.threads} threads, {args.reps} reps; load average {load_before} -> {os.getloadavg()}")
    print(table(samples))
    if uncovered:
        print(f"note: the stream ended before the long prompt's first token in {uncovered}: raise STREAM_OUT")
    if args.json is not None:
        out = {n: {w: [asdict(x) for x in xs] for w, xs in s.items()} for n, s in samples.items()}
        args.json.write_text(json.dumps({"load": [load_before, os.getloadavg()], "samples": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
