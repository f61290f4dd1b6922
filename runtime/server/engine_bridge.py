"""asyncio side of the engine: submit requests, read each one's `RequestOutput`s, abort leftovers.

The engine loop runs in its own thread and calls `on_output` there. Waking the event loop is a self-pipe write
during which the engine thread lets go of the GIL, and the woken loop takes it: woken per output, the loop would
handle each token while the engine thread waits. So outputs are queued, and the loop is woken once per engine
step (`EngineClient.add_step_listener`) to drain all of them, for every request; a client without step notices
gets a wake-up per output, coalesced while one is pending. In the process layout (`--engine-process`) the event
loop itself reads each step's outputs from the engine process and drains them at once, with no wake-up.
A step that produced some request's FIRST token hands over to the loop: the engine thread waits (at most
FIRST_TOKEN_HANDOFF_S) until the loop has drained that step and written what it queued, before it starts the next
step. Why: the event loop is SCHED_BATCH (it defers to the engine, server/launch.py) and the next step keeps every
core busy (the engine thread and its kernels' worker threads), so the first token could wait for a scheduler
tick, 4-13 ms on a two-core host, and time to first token is the latency a client sees. Later tokens do not wait.
Whatever ends an HTTP exchange early (client disconnect, error, server shutdown) goes through
`RequestGroup.close()`, which aborts the unfinished requests so their KV pages and state slots go back to the
pools.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from runtime.core.requests import GenerateRequest, RequestOutput
from runtime.engine.api import EngineClient

OutputSink = Callable[[RequestOutput], None]

# The longest the engine thread waits for the event loop to write a step's first tokens (normally well under 1 ms).
FIRST_TOKEN_HANDOFF_S = 0.005


class DuplicateRequestId(ValueError):
    pass


class AsyncEngine:
    def __init__(self, client: EngineClient, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.last_output_time = 0.0  # monotonic time of the latest output of any request (health checks)
        self._active: set[str] = set()
        # Filled by the engine thread (or a PD fetch thread), drained on the event loop.
        self._inbox: collections.deque[tuple[OutputSink, RequestOutput]] = collections.deque()
        self._wake_pending = False
        # First-token handoff (module docstring): set by the engine thread, answered by _drain on the loop.
        self._first_tokens = False  # engine thread: the step being reported produced a request's first token
        self._want_handoff = False
        self._handed = threading.Event()
        self._handoff_lock = threading.Lock()  # the flag's test-and-clear on the loop vs its set on the engine
        self.handoffs = 0  # steps the loop answered within the timeout
        self.handoff_timeouts = 0  # steps that gave up waiting
        self._loop_thread = threading.get_ident()  # built on the event loop (ServerContext.engine)
        # True: outputs come from the engine thread only, each step followed by _step_done; wake up once per step.
        self._per_step = client.add_step_listener(self._step_done)
        client.bind_event_loop(loop)

    @property
    def num_active(self) -> int:
        return len(self._active)

    def submit(self, req: GenerateRequest, sink: OutputSink) -> None:
        """Hand a request to the engine; `sink` gets its outputs on the event loop, the last with finished=True."""
        if req.rid in self._active:
            raise DuplicateRequestId(f"Duplicate request ID detected: {req.rid}")

        def on_output(out: RequestOutput) -> None:  # engine thread (PD decode: also its fetch threads)
            self._inbox.append((sink, out))
            if out.new_token_ids and out.completion_tokens == len(out.new_token_ids):
                self._first_tokens = True
            if not self._per_step:
                self._wake()

        self._active.add(req.rid)
        try:
            self.client.add_request(req, on_output)
        except BaseException:
            self._active.discard(req.rid)
            raise

    def _step_done(self) -> None:  # engine thread (process layout: the event loop), after a step's outputs
        if not self._inbox:
            return
        if threading.get_ident() == self._loop_thread:
            self._first_tokens = False
            self._drain()  # the process layout read the step on the loop itself: nothing to wake
            return
        handoff, self._first_tokens = self._first_tokens, False
        if handoff:
            with self._handoff_lock:
                self._handed.clear()
                self._want_handoff = True
        self._wake()
        if handoff:
            if self._handed.wait(FIRST_TOKEN_HANDOFF_S):
                self.handoffs += 1
            else:
                self.handoff_timeouts += 1

    def _wake(self) -> None:
        if self._wake_pending:
            return  # the pending _drain runs after this output was queued (it clears the flag before it reads)
        self._wake_pending = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            pass  # the event loop is closed: the server is shutting down and nobody is listening

    def _drain(self) -> None:
        self._wake_pending = False  # before reading: an output queued from now on schedules its own drain
        with self._handoff_lock:
            handoff, self._want_handoff = self._want_handoff, False
        inbox = self._inbox
        if inbox:
            self.last_output_time = time.monotonic()
        while inbox:
            sink, out = inbox.popleft()
            if out.finished:
                self._active.discard(out.rid)
            sink(out)
        if handoff:
            # After the callbacks the sinks scheduled (the streams' writes): call_soon runs them in order.
            self.loop.call_soon(self._handed.set)

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
        self._ready: list[tuple[int, RequestOutput]] = []
        self._waiter: asyncio.Future[None] | None = None
        self._unfinished: set[str] = set()
        self._closed = False
        try:
            for i, req in enumerate(requests):
                engine.submit(req, functools.partial(self._deliver, i))
                self._unfinished.add(req.rid)
        except BaseException:
            self.close()
            raise

    def _deliver(self, index: int, out: RequestOutput) -> None:
        self._ready.append((index, out))
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def batches(self) -> AsyncGenerator[list[tuple[int, RequestOutput]], None]:
        """Everything that arrived since the last batch, as (index in the group, output), until all finish.

        A reader that falls behind gets several outputs of one request at once and may answer them with one
        chunk (the text and ids are cumulative).
        """
        try:
            while self._unfinished:
                if not self._ready:
                    self._waiter = asyncio.get_running_loop().create_future()
                    try:
                        await self._waiter
                    finally:
                        self._waiter = None
                batch, self._ready = self._ready, []
                for _, out in batch:
                    if out.finished:
                        self._unfinished.discard(out.rid)
                yield batch
        finally:
            self.close()

    async def updates(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(index in the group, output) until every request has finished."""
        async for batch in self.batches():
            for item in batch:
                yield item

    def close(self) -> None:
        """Abort what has not finished; idempotent, safe from any exit path.

        The engine answers every abort with a final output; it lands in `_ready` and ends `batches()` for a
        reader still waiting (e.g. a non-streaming request whose client hung up).
        """
        if self._closed:
            return
        self._closed = True
        for rid in list(self._unfinished):
            self.engine.abort(rid)
