"""asyncio side of the engine: submit requests, read each one's `RequestOutput`s, abort leftovers.

The engine loop runs in its own thread and calls `on_output` there; each output is handed to the event loop
with `call_soon_threadsafe`. Whatever ends an HTTP exchange early (client disconnect, error, server shutdown)
goes through `RequestGroup.close()`, which aborts the unfinished requests so their KV pages and state slots go
back to the pools.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from runtime.engine.api import EngineClient, GenerateRequest, RequestOutput


class DuplicateRequestId(ValueError):
    pass


class AsyncEngine:
    def __init__(self, client: EngineClient, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.last_output_time = 0.0  # monotonic time of the latest output of any request (health checks)
        self._active: set[str] = set()

    @property
    def num_active(self) -> int:
        return len(self._active)

    def submit(self, req: GenerateRequest) -> asyncio.Queue[RequestOutput]:
        """Hand a request to the engine; its outputs arrive on the queue, the last with finished=True."""
        if req.rid in self._active:
            raise DuplicateRequestId(f"Duplicate request ID detected: {req.rid}")
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()

        def on_output(out: RequestOutput) -> None:  # runs in the engine thread
            try:
                self.loop.call_soon_threadsafe(self._deliver, queue, out)
            except RuntimeError:
                pass  # the event loop is closed: the server is shutting down and nobody is listening

        self._active.add(req.rid)
        try:
            self.client.add_request(req, on_output)
        except BaseException:
            self._active.discard(req.rid)
            raise
        return queue

    def _deliver(self, queue: asyncio.Queue[RequestOutput], out: RequestOutput) -> None:
        self.last_output_time = time.monotonic()
        if out.finished:
            self._active.discard(out.rid)
        queue.put_nowait(out)

    def abort(self, rid: str) -> None:
        """Abort a request that has not finished (a no-op for one that has)."""
        if rid in self._active:
            self.client.abort(rid)

    def abort_all(self) -> int:
        """Abort every unfinished request (server shutdown); returns how many there were."""
        rids = list(self._active)
        for rid in rids:
            self.client.abort(rid)
        return len(rids)


class RequestGroup:
    """The engine requests behind one HTTP exchange (a prompt or a batch), read as one stream."""

    def __init__(self, engine: AsyncEngine, requests: list[GenerateRequest]) -> None:
        self.engine = engine
        self.rids = [r.rid for r in requests]
        self._merged: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
        self._pumps: list[asyncio.Task[None]] = []  # held so the tasks are not garbage-collected mid-run
        self._unfinished: set[str] = set()
        self._closed = False
        queues: list[asyncio.Queue[RequestOutput]] = []
        try:
            for req in requests:
                queues.append(engine.submit(req))
                self._unfinished.add(req.rid)
        except BaseException:
            self.close()
            raise
        for i, q in enumerate(queues):
            self._pumps.append(asyncio.get_running_loop().create_task(self._pump(i, q)))

    async def _pump(self, index: int, queue: asyncio.Queue[RequestOutput]) -> None:
        while True:
            out = await queue.get()
            self._merged.put_nowait((index, out))
            if out.finished:
                return

    async def updates(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(index in the group, output) until every request has finished."""
        try:
            while self._unfinished:
                index, out = await self._merged.get()
                if out.finished:
                    self._unfinished.discard(out.rid)
                yield index, out
        finally:
            self.close()

    def close(self) -> None:
        """Abort what has not finished; idempotent, safe from any exit path.

        The pumps stay alive: the engine answers every abort with a final output, which ends them (and ends
        `updates()` for a reader still waiting, e.g. a non-streaming request whose client hung up).
        """
        if self._closed:
            return
        self._closed = True
        for rid in list(self._unfinished):
            self.engine.abort(rid)
