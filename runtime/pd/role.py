"""What a PD role adds to the engine client it wraps: it routes requests that carry a transfer room; every other
operation is the wrapped client's, so a PD server is driven like any other."""

from __future__ import annotations

from typing import Any

from runtime.core.requests import EngineStats
from runtime.engine.api import EngineClient
from runtime.engine.engine_thread import ThreadedEngineClient


class RoleClient(EngineClient):
    """The engine client of a `--disaggregation-mode <mode>` server. The step-listener promise is not passed on:
    the decode side finishes a failed transfer from its fetch thread, off the engine thread, so the server takes
    each output as it comes."""

    mode = ""

    def __init__(self, inner: ThreadedEngineClient) -> None:
        self.inner = inner

    def abort(self, rid: str) -> None:
        self.inner.abort(rid)

    def flush_cache(self) -> bool:
        return bool(self.inner.flush_cache())

    def hold_idle_work(self, hold: bool) -> None:
        self.inner.hold_idle_work(hold)

    def failure(self) -> str | None:
        return self.inner.failure()

    def stats(self) -> EngineStats:
        return self.inner.stats()

    def resolved_args(self) -> dict[str, Any]:
        return {**self.inner.resolved_args(), "disaggregation_mode": self.mode}

    def shutdown(self) -> None:
        self.inner.shutdown()
