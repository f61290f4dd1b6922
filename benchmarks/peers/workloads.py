"""The workload every engine runs, as token ids, and how each number is measured from the streamed requests.

Prompts are random token ids (special tokens excluded) from one seed, so every engine sees exactly the same
requests. A prefix cache can only hit where a workload means it to: each cold prompt is fresh.

- cold: a fresh 2048-token prompt, 8 output tokens; TTFT.
- warm: the cold prompt's first 2000 tokens + 48 fresh ones (right after the cold one); TTFT, and warm / cold.
- repeat: the cold prompt again, exactly; TTFT. Its output must equal the cold one's (cache-consistency).
- concurrent: 8 requests at once, 128-token prompts, 128 output tokens each; output tokens / wall time.
- single: one 128-token prompt, 128 output tokens; decode tok/s ((n - 1) / (E2E - TTFT)). The first
  repetition's output is compared with transformers' fp32 greedy output (the reference row) token by token.
- concurrent and single run once per repetition too, each time on fresh prompts, and report the median: one
  sample of either swung by 1.3x between back-to-back runs of the same server.
- generated-shared-prefix: SGLang's shape (hybridctl bench's defaults: 4 groups x 4 prompts, 512-token system
  prompt + 64-token question, 32 output tokens) shuffled, 8 in flight; output tok/s, mean TTFT, hit rate.
- long prompts among decoding streams (mixed_workload.py), once: a stream's longest inter-token gap while an
  8000-token prompt is prefilled, and the output tok/s of long prompts arriving while short ones decode.

Engines measured together (run.py's default) take turns per workload and repetition (`measure`): this host's
speed swings by 1.5x within minutes, and an engine measured a minute after another would carry that swing in its
ratio. Every request still runs alone on the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from clients import EngineClient, RequestResult
from http_stream import Connections
from mixed_workload import MixedPrompts, MixedSample, PauseSample, build_mixed_prompts, decode_pause, mixed_throughput

from hybridctl.bench.datasets import SharedPrefixShape

COLD_LEN, WARM_SHARED, REPEAT_OUT = 2048, 2000, 8
CONC_N, CONC_PROMPT, CONC_OUT = 8, 128, 128
SINGLE_PROMPT, SINGLE_OUT = 128, 128
GSP_SHAPE = SharedPrefixShape()
GSP_CONCURRENCY = 8


@dataclass(frozen=True)
class Prompts:
    cold: list[list[int]]  # one per repetition
    warm: list[list[int]]
    concurrent: list[list[list[int]]]  # per repetition: CONC_N prompts
    single: list[list[int]]  # one per repetition
    gsp: list[list[int]]
    warmup: list[int]
    mixed: MixedPrompts


def build_prompts(vocab_size: int, first_id: int, reps: int, seed: int = 0) -> Prompts:
    """All prompts of a run; ids in [first_id, vocab_size) so no prompt holds a special token."""
    rng = random.Random(seed)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(first_id, vocab_size) for _ in range(n)]

    cold = [fresh(COLD_LEN) for _ in range(reps)]
    warm = [c[:WARM_SHARED] + fresh(COLD_LEN - WARM_SHARED) for c in cold]
    gsp = []
    for _ in range(GSP_SHAPE.num_groups):
        system = fresh(GSP_SHAPE.system_prompt_len)
        gsp += [system + fresh(GSP_SHAPE.question_len) for _ in range(GSP_SHAPE.prompts_per_group)]
    rng.shuffle(gsp)
    return Prompts(
        cold=cold,
        warm=warm,
        concurrent=[[fresh(CONC_PROMPT) for _ in range(CONC_N)] for _ in range(reps)],
        single=[fresh(SINGLE_PROMPT) for _ in range(reps)],
        gsp=gsp,
        warmup=fresh(COLD_LEN),
        mixed=build_mixed_prompts(vocab_size, first_id, seed),
    )


def _ms(seconds: list[float]) -> float:
    return 1000.0 * statistics.median(seconds)


async def _bounded(
    client: EngineClient, http: Connections, prompts: list[list[int]], max_new: int, limit: int
) -> tuple[list[RequestResult], float]:
    gate = asyncio.Semaphore(limit)

    async def one(ids: list[int]) -> RequestResult:
        async with gate:
            return await client.generate(http, ids, max_new)

    start = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in prompts))
    return list(results), time.perf_counter() - start


class EngineRun:
    """One engine's side of a run: its HTTP client and the samples each phase adds (see `measure`)."""

    def __init__(self, client: EngineClient, http: Connections) -> None:
        self.client, self.http = client, http
        self.cold: list[float] = []
        self.warm: list[float] = []
        self.repeat: list[float] = []
        self.warm_cached: list[int | None] = []
        self.repeat_cached: list[int | None] = []
        self.consistent = True
        self.conc_rates: list[float] = []
        self.singles: list[RequestResult] = []
        self.gsp: list[RequestResult] = []
        self.gsp_wall = 0.0
        self.pause: PauseSample | None = None
        self.mixed_load: MixedSample | None = None

    async def warmup(self, prompts: Prompts) -> None:
        # Lazy initialisation, first-shape compilation and allocator growth stay out of the numbers.
        await self.client.generate(self.http, prompts.warmup, 4)
        await _bounded(self.client, self.http, [p[:32] for p in prompts.concurrent[0]], 4, CONC_N)

    async def prefix(self, cold_ids: list[int], warm_ids: list[int]) -> None:
        """cold, warm, repeat: back to back on this engine (warm needs the cold prompt just cached)."""
        c = await self.client.generate(self.http, cold_ids, REPEAT_OUT)
        w = await self.client.generate(self.http, warm_ids, REPEAT_OUT)
        r = await self.client.generate(self.http, cold_ids, REPEAT_OUT)
        self.cold.append(c.ttft_s)
        self.warm.append(w.ttft_s)
        self.repeat.append(r.ttft_s)
        self.warm_cached.append(w.cached_tokens)
        self.repeat_cached.append(r.cached_tokens)
        self.consistent &= c.output_ids == r.output_ids

    async def concurrent(self, prompts: list[list[int]]) -> None:
        conc, wall = await _bounded(self.client, self.http, prompts, CONC_OUT, CONC_N)
        self.conc_rates.append(sum(len(r.output_ids) for r in conc) / wall)

    async def single(self, ids: list[int]) -> None:
        self.singles.append(await self.client.generate(self.http, ids, SINGLE_OUT))

    async def shared_prefix(self, prompts: list[list[int]]) -> None:
        self.gsp, self.gsp_wall = await _bounded(self.client, self.http, prompts, GSP_SHAPE.output_len, GSP_CONCURRENCY)

    async def long_among_decodes(self, prompts: MixedPrompts) -> None:
        """Its rows stay n/a where the engine refuses the workload (an 8000-token prompt): its other rows stand."""
        try:
            self.pause = await decode_pause(self.client, self.http, prompts)
            self.mixed_load = await mixed_throughput(self.client, prompts)
        except Exception as exc:  # noqa: BLE001 - one workload's failure is a note, not the engine's row
            print(f"[{self.client.name}] long prompts among decoding streams: {type(exc).__name__}: {exc}", flush=True)

    def metrics(self, prompts: Prompts) -> dict[str, Any]:
        gsp_cached = [r.cached_tokens for r in self.gsp]
        gsp_hit = (
            sum(c for c in gsp_cached if c is not None) / sum(len(p) for p in prompts.gsp)
            if all(c is not None for c in gsp_cached)
            else None
        )
        return {
            "cold_ttft_ms": _ms(self.cold),
            "warm_ttft_ms": _ms(self.warm),
            "warm_over_cold": statistics.median(self.warm) / statistics.median(self.cold),
            "warm_cached_tokens": self.warm_cached,
            "repeat_ttft_ms": _ms(self.repeat),
            "repeat_cached_tokens": self.repeat_cached,
            "repeat_output_matches_cold": self.consistent,
            "concurrent_out_tok_s": statistics.median(self.conc_rates),
            "single_decode_tok_s": statistics.median(r.decode_tok_s for r in self.singles),
            "single_ttft_ms": 1000.0 * statistics.median(r.ttft_s for r in self.singles),
            "single_output_ids": self.singles[0].output_ids,
            "gsp_out_tok_s": sum(len(r.output_ids) for r in self.gsp) / self.gsp_wall,
            "gsp_mean_ttft_ms": 1000.0 * statistics.mean(r.ttft_s for r in self.gsp),
            "gsp_cache_hit_rate": gsp_hit,
            "decode_pause_ms": self.pause.longest_gap_ms if self.pause else None,
            "pause_long_ttft_ms": self.pause.long_ttft_ms if self.pause else None,
            "mixed_out_tok_s": self.mixed_load.out_tok_s if self.mixed_load else None,
            "mixed_decode_gap_ms": self.mixed_load.longest_gap_ms if self.mixed_load else None,
            "raw_ttft_ms": {
                "cold": [1000 * s for s in self.cold],
                "warm": [1000 * s for s in self.warm],
                "repeat": [1000 * s for s in self.repeat],
            },
            "raw_warm_over_cold": [w / c for w, c in zip(self.warm, self.cold, strict=True)],
            "raw_concurrent_out_tok_s": self.conc_rates,
            "raw_single_decode_tok_s": [r.decode_tok_s for r in self.singles],
        }


# Called around every phase with the engine that runs it and True / False (start / end): run.py reads the other
# engines' CPU time there (what an idle server burns while a peer is measured).
PhaseHook = Callable[[str, bool], None]


class EngineFailed(Exception):
    """An engine's phase raised: the engine drops out of the run; the others go on."""


async def measure(
    clients: dict[str, EngineClient], prompts: Prompts, on_phase: PhaseHook | None = None
) -> dict[str, dict[str, Any] | EngineFailed]:
    """Run every workload against started engines; each one's numbers (see module docstring), or why it failed.

    With several engines, each workload's repetition runs on every engine before the next one starts (cold /
    warm / repeat, then concurrent, then single, for repetition 1, then 2, ...), in an order that alternates per
    repetition, so a host that slows down for a minute slows every engine's samples alike and the ratios hold.
    An engine whose request fails drops out with its error; the others finish the run.
    """
    failed: dict[str, EngineFailed] = {}
    async with contextlib.AsyncExitStack() as stack:
        runs: dict[str, EngineRun] = {}
        for name, client in clients.items():
            http = await stack.enter_async_context(Connections())
            runs[name] = EngineRun(client, http)

        async def each(order: list[str], phase: Callable[..., Awaitable[None]], *args: Any) -> None:
            for name in order:
                if name in failed:
                    continue
                if on_phase is not None:
                    on_phase(name, True)
                try:
                    await phase(runs[name], *args)
                except Exception as exc:  # noqa: BLE001 - one engine's failure is its row, not the run's
                    failed[name] = EngineFailed(f"{type(exc).__name__}: {exc}")
                finally:
                    if on_phase is not None:
                        on_phase(name, False)

        names = list(runs)
        await each(names, EngineRun.warmup, prompts)
        for i in range(len(prompts.cold)):
            order = names if i % 2 == 0 else names[::-1]
            await each(order, EngineRun.prefix, prompts.cold[i], prompts.warm[i])
            await each(order, EngineRun.concurrent, prompts.concurrent[i])
            await each(order, EngineRun.single, prompts.single[i])
        await each(names, EngineRun.shared_prefix, prompts.gsp)
        await each(names, EngineRun.long_among_decodes, prompts.mixed)
    return {name: failed.get(name) or run.metrics(prompts) for name, run in runs.items()}


def agreement(output: list[int], reference: list[int]) -> int:
    """How many leading tokens two greedy outputs share (greedy outputs diverge for good after one miss)."""
    n = 0
    for a, b in zip(output, reference, strict=False):
        if a != b:
            break
        n += 1
    return n
