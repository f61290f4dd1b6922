"""The async load generator: streamed `/generate` requests at a fixed concurrency or a Poisson request rate.

Timing per request uses the same StreamTracker as `verify` (TTFT = first chunk with a token). While the load runs, a
sampler polls `/metrics` for `sglang:num_running_reqs`, so the report can show the concurrency the server really saw,
not only what the client attempted.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from hybridctl.bench.datasets import BenchRequest
from hybridctl.verify.client import ServerError, StreamTracker, Target, generate_payload
from hybridctl.verify.prometheus import MetricsParseError, parse_metrics


@dataclass
class RequestRecord:
    prompt_len: int
    output_len: int  # requested
    ok: bool = False
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    spec_verify_ct: int = 0

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.completion_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)


@dataclass
class LoadRun:
    records: list[RequestRecord]
    duration_s: float
    max_in_flight: int  # client side
    server_max_running: float | None  # max sglang:num_running_reqs seen by the sampler


@dataclass(frozen=True)
class LoadShape:
    max_concurrency: int | None = 8  # None: unbounded
    request_rate: float = math.inf  # requests/s; inf sends all at once (bounded by max_concurrency)
    seed: int = 0


async def _one(client: httpx.AsyncClient, req: BenchRequest) -> RequestRecord:
    record = RequestRecord(prompt_len=req.prompt_len, output_len=req.output_len)
    # ignore_eos: every request produces exactly output_len tokens, as SGLang's bench_serving does by default.
    body = generate_payload(req.prompt, max_new_tokens=req.output_len, stream=True, ignore_eos=True)
    start = time.perf_counter()
    tracker = StreamTracker(start)
    try:
        async with client.stream("POST", "/generate", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                raise ServerError(f"HTTP {resp.status_code}: {resp.text[:200]}")
            async for line in resp.aiter_lines():
                if line:
                    tracker.feed(line, time.perf_counter())
    except (httpx.HTTPError, ServerError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
        record.e2e_s = time.perf_counter() - start
        return record
    result = tracker.finish(time.perf_counter())
    meta = result.meta_info
    record.ok = result.ttft_s is not None
    record.error = None if record.ok else "the stream ended without a token"
    record.ttft_s, record.e2e_s, record.itl_s = result.ttft_s, result.e2e_s, result.itl_s
    record.completion_tokens = result.completion_tokens
    record.prompt_tokens = result.prompt_tokens
    record.cached_tokens = result.cached_tokens
    record.spec_verify_ct = int(meta.get("spec_verify_ct", 0) or 0)
    return record


# A gauge sampled at points: a short run's peak lasts a few hundred ms, so sample often (a loopback
# /metrics scrape is under a millisecond round trip, measured on the bundled runtime).
RUNNING_SAMPLE_EVERY_S = 0.05


async def _sample_running(client: httpx.AsyncClient, stop: asyncio.Event, seen: list[float]) -> None:
    while not stop.is_set():
        try:
            resp = await client.get("/metrics")
            if resp.status_code != 200:
                return  # metrics off: nothing to sample
            value = parse_metrics(resp.text).total("sglang:num_running_reqs")
            if value is not None:
                seen.append(value)
        except (httpx.HTTPError, MetricsParseError):
            return
        try:
            await asyncio.wait_for(stop.wait(), timeout=RUNNING_SAMPLE_EVERY_S)
        except asyncio.TimeoutError:
            pass


async def run_load(
    target: Target,
    requests: list[BenchRequest],
    shape: LoadShape,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> LoadRun:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(target.timeout_s, connect=10.0)
    rng = random.Random(shape.seed)
    gate = asyncio.Semaphore(shape.max_concurrency) if shape.max_concurrency else None
    in_flight = 0
    max_in_flight = 0
    running_seen: list[float] = []

    async with httpx.AsyncClient(base_url=target.url, headers=target.headers(), timeout=timeout,
                                 limits=limits) as client:  # fmt: skip

        async def guarded(req: BenchRequest) -> RequestRecord:
            nonlocal in_flight, max_in_flight
            if gate is not None:
                await gate.acquire()
            in_flight += 1
            max_in_flight = max(max_in_flight, in_flight)
            try:
                record = await _one(client, req)
            finally:
                in_flight -= 1
                if gate is not None:
                    gate.release()
            if on_done is not None:
                on_done(record)
            return record

        stop = asyncio.Event()
        sampler = asyncio.create_task(_sample_running(client, stop, running_seen))
        start = time.perf_counter()
        tasks = []
        for req in requests:
            tasks.append(asyncio.create_task(guarded(req)))
            if math.isfinite(shape.request_rate):
                await asyncio.sleep(rng.expovariate(shape.request_rate))
        records = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - start
        stop.set()
        await sampler
    return LoadRun(records, duration, max_in_flight, max(running_seen) if running_seen else None)
