"""The peers harness's timed HTTP client (benchmarks/peers/http_stream.py, clients.py) against real servers on
loopback: the runtime itself, and small asyncio servers that frame, close and refuse the way other engines' HTTP
layers do (a Content-Length body, a kept-alive connection closed while idle, an error status)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "peers"))

from clients import RuntimeClient  # noqa: E402
from http_stream import Connections, HttpError  # noqa: E402

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return await reader.readexactly(length)


async def _serve(handler: Handler, body: Callable[[str], Awaitable[None]]) -> None:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        await body(f"http://127.0.0.1:{port}/generate")


def test_runtime_stream_reuses_one_connection_and_reports_the_cache(
    demo_model_dir: Path, runtime_server_factory: Callable[..., object]
) -> None:
    prompt = list(range(10, 90))

    async def run(url: str) -> None:
        client = RuntimeClient(url)
        async with Connections() as http:
            first = await client.generate(http, prompt, 6)
            assert http.idle_connections(url) == 1
            again = await client.generate(http, prompt, 6)
            assert http.idle_connections(url) == 1  # the same connection carried both
        assert len(first.output_ids) == 6 and again.output_ids == first.output_ids
        assert 0 < first.ttft_s <= first.e2e_s and len(first.chunk_times) >= 1
        # A hybrid model's cache serves whole state checkpoints (64 tokens here) of the repeated prompt.
        assert first.cached_tokens == 0 and again.cached_tokens is not None and again.cached_tokens >= 64

    with runtime_server_factory(demo_model_dir, "--memory-budget-gib", "0.5") as server:  # type: ignore[operator]
        asyncio.run(run(server.url))


def test_content_length_body_and_a_connection_closed_while_idle() -> None:
    """A server that answers with Content-Length framing and then closes the kept-alive connection: the next
    request goes out on a new one instead of failing."""
    served: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(await _read_request(reader))
        body = b'data: {"output_ids": [7]}\n\ndata: {"output_ids": [7, 8]}\n\ndata: [DONE]\n\n'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()  # without a "Connection: close" header: the client finds out when it reuses it

    async def body(url: str) -> None:
        async with Connections() as http:
            for _ in range(3):
                events = [e async for e in http.sse(url, {"input_ids": [1]}, lambda: None)]
                assert events == [{"output_ids": [7]}, {"output_ids": [7, 8]}]
                await asyncio.sleep(0.05)  # the close reaches the client while the connection is idle
        assert len(served) == 3

    asyncio.run(_serve(handler, body))


def test_an_error_status_is_an_error_with_the_status_and_body() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        body = b'{"error": "prompt too long"}'
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()

    async def body(url: str) -> None:
        async with Connections() as http:
            with pytest.raises(HttpError, match="400.*prompt too long"):
                async for _ in http.sse(url, {"input_ids": [1]}, lambda: None):
                    pass
            assert http.idle_connections(url) == 0  # an errored exchange is not reused

    asyncio.run(_serve(handler, body))
