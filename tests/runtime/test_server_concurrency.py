"""Many concurrent streams sharing prefixes, some cancelled mid-stream: nothing leaks, the server serves on.

The accounting is read from the server's own /server_info (internal_states): for KV pages and for state slots,
free + cached + in use must equal the pool size, and nothing may stay in use once every request is gone.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from tests.runtime.conftest import RunningServer

NUM_STREAMS = 64
CANCEL_EVERY = 4  # every 4th stream hangs up after a few chunks
MAX_NEW_TOKENS = 24


async def _stream_one(client: httpx.AsyncClient, i: int, prefix: list[int]) -> dict[str, Any]:
    ids = prefix + [1000 + i, 1100 + i, 1200 + (i % 7)]
    body = {
        "input_ids": ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True},
        "stream": True,
        "rid": f"concurrency-{i}",
    }
    cancel = i % CANCEL_EVERY == 0
    chunks = 0
    last: dict[str, Any] | None = None
    done = False
    async with client.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line:
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                done = True
                break
            last = json.loads(data)
            chunks += 1
            if cancel and chunks == 3:
                break  # leaving the block closes the connection mid-stream
    return {"cancelled": cancel, "done": done, "last": last, "chunks": chunks}


async def _run_all(url: str, prefixes: list[list[int]]) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=NUM_STREAMS + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=300.0, limits=limits) as client:
        tasks = [_stream_one(client, i, prefixes[i % len(prefixes)]) for i in range(NUM_STREAMS)]
        return await asyncio.gather(*tasks)


def _internal_state(client: httpx.Client) -> dict[str, Any]:
    return client.get("/server_info").json()["internal_states"][0]


def _assert_accounted(state: dict[str, Any]) -> None:
    for pool in ("kv_pages", "state_slots"):
        parts = state[f"{pool}_free"] + state[f"{pool}_cached"] + state[f"{pool}_in_use"]
        assert parts == state[f"{pool}_total"], (pool, state)


def _wait_idle(client: httpx.Client, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    state = _internal_state(client)
    while time.monotonic() < deadline:
        state = _internal_state(client)
        _assert_accounted(state)  # must hold at every moment, not only at rest
        idle = state["num_running_reqs"] == 0 and state["num_queue_reqs"] == 0
        if idle and state["kv_pages_in_use"] == 0 and state["state_slots_in_use"] == 0:
            return state
        time.sleep(0.2)
    raise AssertionError(f"server not idle after {timeout_s}s: {state}")


@pytest.mark.slow
def test_concurrent_streams_with_cancellations_leak_nothing(runtime_server: RunningServer) -> None:
    prefixes = [list(range(20 + 300 * k, 20 + 300 * k + 150)) for k in range(4)]  # 4 shared 150-token prefixes
    with httpx.Client(base_url=runtime_server.url, timeout=120.0) as client:
        before = _wait_idle(client)
        results = asyncio.run(_run_all(runtime_server.url, prefixes))
        after = _wait_idle(client)

        completed = [r for r in results if not r["cancelled"]]
        cancelled = [r for r in results if r["cancelled"]]
        assert len(cancelled) == NUM_STREAMS // CANCEL_EVERY
        for r in completed:
            assert r["done"], r
            meta = r["last"]["meta_info"]
            assert meta["finish_reason"]["type"] == "length"
            assert meta["completion_tokens"] == MAX_NEW_TOKENS
        # Requests sharing a prefix found it cached (the radix cache served them).
        assert sum(r["last"]["meta_info"]["cached_tokens"] > 0 for r in completed) > 0
        # The hung-up streams were aborted in the engine, not run to the end.
        # (21 tokens were still to come when they hung up; half is a margin for a very slow machine.)
        assert after["num_requests_aborted"] - before["num_requests_aborted"] >= len(cancelled) // 2
        assert after["num_requests_total"] - before["num_requests_total"] >= NUM_STREAMS

        # Same prompt, greedy, now alone: the answer equals what the concurrent stream produced.
        probe = completed[0]["last"]
        index = int(probe["meta_info"]["id"].split("-")[1])
        ids = prefixes[index % len(prefixes)] + [1000 + index, 1100 + index, 1200 + (index % 7)]
        params = {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
        alone = client.post("/generate", json={"input_ids": ids, "sampling_params": params})
        assert alone.status_code == 200
        assert alone.json()["output_ids"] == probe["output_ids"]
        assert client.get("/health").status_code == 200
        _assert_accounted(_wait_idle(client))


def _finished_non_streaming(client: httpx.Client) -> float:
    """Non-streaming requests whose handler ran to its end (the server's e2e latency histogram count)."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("sglang:e2e_request_latency_seconds_count") and 'is_streaming="false"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_non_streaming_client_disconnect_aborts_the_request(runtime_server: RunningServer) -> None:
    with httpx.Client(base_url=runtime_server.url, timeout=120.0) as client:
        before = _wait_idle(client)
        handled_before = _finished_non_streaming(client)
        body = {
            "input_ids": list(range(50, 90)),
            "sampling_params": {"temperature": 0, "max_new_tokens": 4000, "ignore_eos": True},
        }
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(runtime_server.url + "/generate", json=body, timeout=httpx.Timeout(120.0, read=1.0))
        after = _wait_idle(client, timeout_s=30.0)
        assert after["num_requests_aborted"] == before["num_requests_aborted"] + 1
        assert after["generation_tokens_total"] - before["generation_tokens_total"] < 4000
        # The handler itself did not hang on the aborted request: it saw the final output and finished.
        deadline = time.monotonic() + 60
        while _finished_non_streaming(client) < handled_before + 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _finished_non_streaming(client) == handled_before + 1
