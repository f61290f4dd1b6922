"""The timed requests' HTTP client: HTTP/1.1 over asyncio streams, a streamed POST whose SSE events arrive as they
are read, kept-alive connections reused per host.

Why not httpx for these: its AsyncClient spent 1.3-2.1 ms per request before the request's first byte reached
the socket (measured here with a hook on the transport's write: 2.1 ms from the call, 1.3 ms from httpcore's own
"send_request_headers.started" trace event; a raw socket's request reached the runtime's handler 0.35 ms after
it was sent, httpx's 2.8 ms after the call), and parsed each chunk in a few layers of Python. That is client time
inside every TTFT the harness reports, a tenth of a warm prefix hit's, on a two-core host where the client also
competes with the server for the cores. This client's clock starts at the request's first network action (the
connect, or the write on a reused connection) and stops at the chunk that carries a token.

Only what the three engines' streaming endpoints need: a JSON body, a `200` with chunked or Content-Length
framing, `data:` lines. Anything else is an `HttpError` with the status and the start of the body.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

READ_TIMEOUT_S = 600.0  # one read (a cold prompt's prefill on a slow engine can take minutes)
CONNECT_TIMEOUT_S = 10.0


class HttpError(RuntimeError):
    pass


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.reused = False  # it has carried a request before

    async def line(self) -> bytes:
        return await asyncio.wait_for(self.reader.readline(), READ_TIMEOUT_S)

    async def exactly(self, n: int) -> bytes:
        return await asyncio.wait_for(self.reader.readexactly(n), READ_TIMEOUT_S)

    def close(self) -> None:
        self.writer.close()


class Connections:
    """Kept-alive connections per (host, port), each carrying one request at a time; `async with` closes them."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Conn]] = {}

    async def __aenter__(self) -> Connections:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for conns in self._idle.values():
            for c in conns:
                c.close()
        self._idle.clear()

    def idle_connections(self, url: str) -> int:
        """Kept-alive connections to `url`'s host and port waiting for a next request."""
        return len(self._idle.get(_address(url), []))

    async def sse(
        self, url: str, body: dict[str, Any], on_the_wire: Callable[[], None], *, close: bool = False
    ) -> AsyncIterator[dict[str, Any]]:
        """POST `body` as JSON to `url` and yield each `data:` event's JSON until `[DONE]` or the body's end.
        `on_the_wire()` runs at the request's first network action. `close`: ask the server to close the
        connection afterwards (llama-server drops a kept-alive connection after a stream)."""
        host, port = _address(url)
        payload = json.dumps(body).encode()
        head = (
            f"POST {urlsplit(url).path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n"
            f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
        ).encode()
        idle = self._idle.setdefault((host, port), [])
        while idle and (idle[-1].reader.at_eof() or idle[-1].writer.is_closing()):
            idle.pop().close()  # the server closed it while it was idle (uvicorn's keep-alive timeout is 5 s)
        on_the_wire()
        conn = idle.pop() if idle else await _connect(host, port)
        reusable = False
        try:
            try:
                status, headers = await _request(conn, head + payload)
            except (HttpError, ConnectionError):
                if not conn.reused:
                    raise
                # A kept-alive connection the server closed as the request went out: once more on a new one.
                conn.close()
                conn = await _connect(host, port)
                status, headers = await _request(conn, head + payload)
            chunks = _body(conn, headers)
            if status != 200:
                text = b"".join([c async for c in chunks]).decode(errors="replace")[:500]
                raise HttpError(f"POST {url} -> {status}: {text}")
            pending = b""
            async for data in chunks:
                pending += data
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    event = line[5:].strip()
                    if event != b"[DONE]":
                        yield json.loads(event)
            kept = not close and headers.get("connection", "").lower() != "close"
            reusable = kept and _framing(headers) != "until-close"
        finally:
            if reusable:
                conn.reused = True
                idle.append(conn)
            else:
                conn.close()


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def _framing(headers: dict[str, str]) -> str:
    """How the body ends: "chunked", "length" (Content-Length), or "until-close"."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return "chunked"
    return "length" if "content-length" in headers else "until-close"


async def _request(conn: _Conn, data: bytes) -> tuple[int, dict[str, str]]:
    conn.writer.write(data)
    return await _response_head(conn)


async def _connect(host: str, port: int) -> _Conn:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
    return _Conn(reader, writer)


async def _response_head(conn: _Conn) -> tuple[int, dict[str, str]]:
    status_line = await conn.line()
    if not status_line:
        raise HttpError("the server closed the connection without an answer")
    try:
        status = int(status_line.split()[1])
    except (IndexError, ValueError):
        raise HttpError(f"not an HTTP answer: {status_line[:100]!r}") from None
    headers: dict[str, str] = {}
    while True:
        line = await conn.line()
        if line in (b"\r\n", b"\n", b""):
            return status, headers
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()


async def _body(conn: _Conn, headers: dict[str, str]) -> AsyncIterator[bytes]:
    """The body's bytes as they arrive: chunked, Content-Length, or until the server closes."""
    framing = _framing(headers)
    if framing == "chunked":
        while True:
            size = int((await conn.line()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await conn.line()) not in (b"\r\n", b"\n", b""):  # trailers
                    pass
                return
            data = await conn.exactly(size)
            await conn.line()  # the chunk's CRLF
            yield data
    elif framing == "length":
        left = int(headers["content-length"])
        while left > 0:
            data = await asyncio.wait_for(conn.reader.read(min(left, 65536)), READ_TIMEOUT_S)
            if not data:
                raise HttpError("the server closed the connection mid-body")
            left -= len(data)
            yield data
    else:
        while data := await asyncio.wait_for(conn.reader.read(65536), READ_TIMEOUT_S):
            yield data
