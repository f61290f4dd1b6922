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
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

import httpx
from clients import EngineClient, RequestResult

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
    )


def _ms(seconds: list[float]) -> float:
    return 1000.0 * statistics.median(seconds)


async def _bounded(
    client: EngineClient, http: httpx.AsyncClient, prompts: list[list[int]], max_new: int, limit: int
) -> tuple[list[RequestResult], float]:
    gate = asyncio.Semaphore(limit)

    async def one(ids: list[int]) -> RequestResult:
        async with gate:
            return await client.generate(http, ids, max_new)

    start = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in prompts))
    return list(results), time.perf_counter() - start


async def measure(client: EngineClient, prompts: Prompts) -> dict[str, Any]:
    """Run every workload once against a started engine and return its numbers (see module docstring)."""
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    async with httpx.AsyncClient(limits=limits, trust_env=False) as http:
        # Warm-up: lazy initialisation, first-shape compilation and allocator growth stay out of the numbers.
        await client.generate(http, prompts.warmup, 4)
        await _bounded(client, http, [p[:32] for p in prompts.concurrent[0]], 4, CONC_N)

        cold, warm, repeat, consistent = [], [], [], True
        warm_cached: list[int | None] = []
        repeat_cached: list[int | None] = []
        for cold_ids, warm_ids in zip(prompts.cold, prompts.warm, strict=True):
            c = await client.generate(http, cold_ids, REPEAT_OUT)
            w = await client.generate(http, warm_ids, REPEAT_OUT)
            r = await client.generate(http, cold_ids, REPEAT_OUT)
            cold.append(c.ttft_s)
            warm.append(w.ttft_s)
            repeat.append(r.ttft_s)
            warm_cached.append(w.cached_tokens)
            repeat_cached.append(r.cached_tokens)
            consistent &= c.output_ids == r.output_ids

        conc_rates, singles = [], []
        for conc_prompts, single_prompt in zip(prompts.concurrent, prompts.single, strict=True):
            conc, conc_wall = await _bounded(client, http, conc_prompts, CONC_OUT, CONC_N)
            conc_rates.append(sum(len(r.output_ids) for r in conc) / conc_wall)
            singles.append(await client.generate(http, single_prompt, SINGLE_OUT))
        gsp, gsp_wall = await _bounded(client, http, prompts.gsp, GSP_SHAPE.output_len, GSP_CONCURRENCY)

    gsp_cached = [r.cached_tokens for r in gsp]
    gsp_hit = (
        sum(c for c in gsp_cached if c is not None) / sum(len(p) for p in prompts.gsp)
        if all(c is not None for c in gsp_cached)
        else None
    )
    return {
        "cold_ttft_ms": _ms(cold),
        "warm_ttft_ms": _ms(warm),
        "warm_over_cold": statistics.median(warm) / statistics.median(cold),
        "warm_cached_tokens": warm_cached,
        "repeat_ttft_ms": _ms(repeat),
        "repeat_cached_tokens": repeat_cached,
        "repeat_output_matches_cold": consistent,
        "concurrent_out_tok_s": statistics.median(conc_rates),
        "single_decode_tok_s": statistics.median(r.decode_tok_s for r in singles),
        "single_ttft_ms": 1000.0 * statistics.median(r.ttft_s for r in singles),
        "single_output_ids": singles[0].output_ids,
        "gsp_out_tok_s": sum(len(r.output_ids) for r in gsp) / gsp_wall,
        "gsp_mean_ttft_ms": 1000.0 * statistics.mean(r.ttft_s for r in gsp),
        "gsp_cache_hit_rate": gsp_hit,
        "raw_ttft_ms": {
            "cold": [1000 * s for s in cold],
            "warm": [1000 * s for s in warm],
            "repeat": [1000 * s for s in repeat],
        },
        "raw_concurrent_out_tok_s": conc_rates,
        "raw_single_decode_tok_s": [r.decode_tok_s for r in singles],
    }


def agreement(output: list[int], reference: list[int]) -> int:
    """How many leading tokens two greedy outputs share (greedy outputs diverge for good after one miss)."""
    n = 0
    for a, b in zip(output, reference, strict=False):
        if a != b:
            break
        n += 1
    return n
