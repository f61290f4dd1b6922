"""Every token of every concurrent stream reaches its client, in order, as it is made, over loopback.

The engine thread wakes the event loop once per step for all requests, and a loop that falls behind answers
several outputs of one request with one cumulative chunk. What must hold whatever the coalescing: each chunk
extends the previous one (ids and text), no token is lost (the last chunk carries exactly the engine's
completion_tokens), tokens stream while the request runs (the first chunk comes before the request finished,
and more than one chunk carries tokens), and a batch that mixes plain greedy requests with ones asking for
logprobs or penalties (the scheduler samples those apart) delivers the same way.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from tests.runtime.conftest import RunningServer

MAX_NEW_TOKENS = 32


def _body(i: int, extra: dict[str, Any]) -> dict[str, Any]:
    sampling = {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True, **extra.pop("sampling", {})}
    return {
        "input_ids": [(11 * i + j) % 3000 + 20 for j in range(24 + i)],
        "sampling_params": sampling,
        "stream": True,
        **extra,
    }


async def _read_stream(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    chunks: list[dict[str, Any]] = []
    done = False
    async with client.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            data = line[len("data: ") :]
            assert not done, "a chunk after [DONE]"
            if data == "[DONE]":
                done = True
                continue
            chunks.append(json.loads(data))
    return chunks, done


async def _run(url: str, bodies: list[dict[str, Any]]) -> list[tuple[list[dict[str, Any]], bool]]:
    limits = httpx.Limits(max_connections=len(bodies) + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=300.0, limits=limits) as client:
        return await asyncio.gather(*[_read_stream(client, b) for b in bodies])


def test_concurrent_streams_get_every_token_in_order_while_they_run(runtime_server: RunningServer) -> None:
    extras: list[dict[str, Any]] = [{} for _ in range(8)]
    extras.append({"return_logprob": True})
    extras.append({"sampling": {"frequency_penalty": 0.5}})
    bodies = [_body(i, dict(extra)) for i, extra in enumerate(extras)]
    results = asyncio.run(_run(runtime_server.url, bodies))
    for i, (chunks, done) in enumerate(results):
        assert done, f"stream {i}: no [DONE]"
        assert chunks, f"stream {i}: no chunk"
        ids: list[int] = []
        text = ""
        with_tokens = 0
        for chunk in chunks:
            new_ids, new_text = chunk["output_ids"], chunk["text"]
            assert new_ids[: len(ids)] == ids, f"stream {i}: a chunk does not extend the previous one"
            assert new_text.startswith(text), f"stream {i}: the text does not extend the previous chunk's"
            if len(new_ids) > len(ids):
                with_tokens += 1
            ids, text = new_ids, new_text
        meta = chunks[-1]["meta_info"]
        assert meta["finish_reason"] == {"type": "length", "length": MAX_NEW_TOKENS}
        assert len(ids) == meta["completion_tokens"] == MAX_NEW_TOKENS, f"stream {i}: tokens lost"
        assert chunks[0]["meta_info"]["finish_reason"] is None, f"stream {i}: nothing streamed before the end"
        assert with_tokens >= 2, f"stream {i}: every token came in one chunk"
        if "return_logprob" in bodies[i]:
            assert len(meta["output_token_logprobs"]) == MAX_NEW_TOKENS
