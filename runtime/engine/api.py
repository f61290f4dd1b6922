"""The engine's public API: what the HTTP server (and tests) use to drive the engine (`start_engine` in
engine_thread.py returns one).

The engine loop runs in its own thread (or its own process: engine_process.py). `EngineClient` methods are
thread-safe; `on_output` callbacks are called FROM THE ENGINE THREAD (the process layout: from the event loop
bound with `bind_event_loop`) (an asyncio server hops back with `loop.call_soon_threadsafe`, once per step:
see `EngineClient.add_step_listener`). Every request
gets exactly one `RequestOutput` with `finished=True`, whatever happens to it (stop, length, abort, allocation
failure).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.core.requests import EngineStats, GenerateRequest, RequestOutput

if TYPE_CHECKING:
    import asyncio


class EngineClient:
    """Handle on a running engine. All methods are thread-safe."""

    def add_request(self, req: GenerateRequest, on_output: Callable[[RequestOutput], None]) -> None:
        raise NotImplementedError

    def add_step_listener(self, listener: Callable[[], None]) -> bool:
        """Have `listener` called on the engine thread after every engine step (and the commands before it), once
        that step's outputs were all passed to their `on_output`; a consumer may then buffer outputs and act once
        per step. True when every `on_output` call comes from that thread and is followed by such a call; False
        (this default) when the client makes no such promise: act on each output as it comes."""
        return False

    def bind_event_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The server's event loop, once it runs (called on that loop's thread). A client that reads its engine
        from the loop itself (the process layout) calls `on_output` and the step listeners on that thread; the
        default, engine-thread clients, ignore it."""

    def abort(self, rid: str) -> None:
        """Free everything the request holds; it finishes with type "abort". Unknown rid: no-op."""
        raise NotImplementedError

    def flush_cache(self) -> bool:
        """Empty the prefix cache. False (nothing flushed) while requests run or wait, as SGLang."""
        raise NotImplementedError

    def hold_idle_work(self, hold: bool) -> None:
        """While held, the engine gone idle faults in no free state slots or KV pages for the next requests. The
        server holds it over its start-up warm-up, whose cached state it then flushes: the slot that frees is the
        next request's, and a slot faulted in meanwhile would only stay resident. Default: no idle work."""

    def stats(self) -> EngineStats:
        raise NotImplementedError

    def resolved_args(self) -> dict[str, Any]:
        """The launch options after defaults were resolved (for /server_info)."""
        raise NotImplementedError

    def failure(self) -> str | None:
        """None while the engine loop runs; else why it died (the server then fails /health and exits)."""
        return None

    def shutdown(self) -> None:
        raise NotImplementedError
