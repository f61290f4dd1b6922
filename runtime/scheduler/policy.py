"""Waiting-queue order: fcfs (arrival) or lpm (longest cached prefix first, then arrival)."""

from __future__ import annotations

from collections.abc import Callable

from runtime.scheduler.request import Req


def order_waiting(waiting: list[Req], policy: str, cached_prefix_len: Callable[[Req], int]) -> list[Req]:
    if policy == "lpm":
        for r in waiting:
            r.prefix_hint = cached_prefix_len(r)
        return sorted(waiting, key=lambda r: (-r.prefix_hint, r.arrival))
    return sorted(waiting, key=lambda r: r.arrival)
