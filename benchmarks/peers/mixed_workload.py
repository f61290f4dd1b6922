"""Long prompts arriving while other requests decode, for any engine the harness has a client for
(`clients.EngineClient`: streamed, greedy, ignore-EOS, token ids).

- pause: one stream decodes (a 128-token prompt, STREAM_OUT tokens out); PAUSE_AFTER_S after it starts, a fresh
  LONG_PROMPT-token prompt arrives (1 token out). The row is the longest gap between two of the stream's token
  arrivals while that prompt is prefilled (from its send to its first token), and the long prompt's TTFT. An
  engine that stops every stream for a whole prefill shows the prefill there; one that mixes decode tokens into
  its prefill steps shows one step.
- mixed: MIXED_STREAMS requests (128-token prompts, MIXED_OUT tokens out each) decode while MIXED_LONG fresh
  prompts of MIXED_LONG_PROMPT tokens (MIXED_LONG_OUT out) arrive MIXED_LONG_GAP_S apart; all output tokens over
  the wall time, the decoding streams' longest gap and the long prompts' mean TTFT.

Token arrival times come from the clients' `chunk_times` (seconds after each request went on the wire); a request
sent at `t0` (perf_counter) has its k-th chunk at about `t0 + chunk_times[k]`.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from clients import EngineClient, RequestResult
from http_stream import Connections

LONG_PROMPT, STREAM_PROMPT, STREAM_OUT, PAUSE_AFTER_S = 8000, 128, 1024, 0.3
MIXED_STREAMS, MIXED_OUT = 4, 256
MIXED_LONG, MIXED_LONG_PROMPT, MIXED_LONG_OUT, MIXED_LONG_GAP_S = 2, 4000, 16, 0.5


@dataclass(frozen=True)
class MixedPrompts:
    stream: list[int]
    long: list[int]
    mixed_streams: list[list[int]]
    mixed_long: list[list[int]]


def build_mixed_prompts(vocab_size: int, first_id: int, seed: int) -> MixedPrompts:
    """Fresh random prompts (ids in [first_id, vocab_size)): no prefix cache can serve any of them."""
    rng = random.Random(seed)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(first_id, vocab_size) for _ in range(n)]

    return MixedPrompts(
        stream=fresh(STREAM_PROMPT),
        long=fresh(LONG_PROMPT),
        mixed_streams=[fresh(STREAM_PROMPT) for _ in range(MIXED_STREAMS)],
        mixed_long=[fresh(MIXED_LONG_PROMPT) for _ in range(MIXED_LONG)],
    )


@dataclass(frozen=True)
class Timed:
    sent: float  # perf_counter when the request was handed to the client
    result: RequestResult

    def arrivals(self) -> list[float]:
        return [self.sent + t for t in self.result.chunk_times]

    @property
    def first_token(self) -> float:
        return self.sent + self.result.ttft_s


async def _timed(client: EngineClient, http: Connections, ids: list[int], max_new: int) -> Timed:
    sent = time.perf_counter()
    return Timed(sent, await client.generate(http, ids, max_new))


def longest_gap(arrivals: list[float], start: float, end: float) -> float:
    """The longest interval between consecutive arrivals that overlaps [start, end] (a gap that begins before
    the long prompt is sent and ends after it counts: the stream waited through it)."""
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False) if b > start and a < end]
    return max(gaps, default=0.0)


@dataclass(frozen=True)
class PauseSample:
    longest_gap_ms: float  # the stream's longest inter-token gap while the long prompt was prefilled
    long_ttft_ms: float
    median_gap_ms: float  # the stream's median inter-token gap over its whole life (its decode pace)
    covered: bool  # the stream was still decoding when the long prompt's first token came


async def decode_pause(client: EngineClient, http: Connections, prompts: MixedPrompts) -> PauseSample:
    stream = asyncio.create_task(_timed(client, http, prompts.stream, STREAM_OUT))
    await asyncio.sleep(PAUSE_AFTER_S)
    async with Connections() as other:  # a connection of its own: the stream holds the first one
        long = await _timed(client, other, prompts.long, 1)
    s = await stream
    arrivals = s.arrivals()
    gaps = sorted(b - a for a, b in zip(arrivals, arrivals[1:], strict=False))
    return PauseSample(
        longest_gap_ms=1000.0 * longest_gap(arrivals, long.sent, long.first_token),
        long_ttft_ms=1000.0 * long.result.ttft_s,
        median_gap_ms=1000.0 * gaps[len(gaps) // 2] if gaps else 0.0,
        covered=bool(arrivals) and arrivals[-1] > long.first_token,
    )


@dataclass(frozen=True)
class MixedSample:
    out_tok_s: float  # every request's output tokens over the workload's wall time
    longest_gap_ms: float  # the decoding streams' longest inter-token gap
    long_mean_ttft_ms: float
    wall_s: float


async def mixed_throughput(client: EngineClient, prompts: MixedPrompts) -> MixedSample:
    async def stream(ids: list[int]) -> Timed:
        async with Connections() as http:
            return await _timed(client, http, ids, MIXED_OUT)

    async def long(ids: list[int], delay: float) -> Timed:
        await asyncio.sleep(delay)
        async with Connections() as http:
            return await _timed(client, http, ids, MIXED_LONG_OUT)

    start = time.perf_counter()
    streams = [asyncio.create_task(stream(p)) for p in prompts.mixed_streams]
    longs = [
        asyncio.create_task(long(p, PAUSE_AFTER_S + i * MIXED_LONG_GAP_S)) for i, p in enumerate(prompts.mixed_long)
    ]
    done_streams = [await t for t in streams]
    done_longs = [await t for t in longs]
    wall = time.perf_counter() - start
    tokens = sum(len(t.result.output_ids) for t in done_streams + done_longs)
    gaps = [longest_gap(t.arrivals(), start, start + wall) for t in done_streams]
    return MixedSample(
        out_tok_s=tokens / wall,
        longest_gap_ms=1000.0 * max(gaps),
        long_mean_ttft_ms=1000.0 * sum(t.result.ttft_s for t in done_longs) / len(done_longs),
        wall_s=wall,
    )
