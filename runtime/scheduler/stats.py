"""The scheduler's numbers for /metrics, /server_info and the start-up log: its counters plus the pools' and the
prefix cache's state at the moment of asking, and the decode throughput gauge."""

from __future__ import annotations

from runtime.core.requests import EngineStats
from runtime.kvcache.cache_manager import CacheManager

_RATE_WINDOW = 32  # decode steps (or verify rounds) the throughput gauge averages over


class DecodeRate:
    """Tokens per second over the last decode steps (SGLang's gen_throughput)."""

    def __init__(self) -> None:
        self._steps: list[tuple[float, int]] = []

    def record(self, seconds: float, tokens: int) -> None:
        self._steps.append((seconds, tokens))
        del self._steps[:-_RATE_WINDOW]

    def tokens_per_s(self) -> float:
        secs = sum(t for t, _ in self._steps)
        return sum(n for _, n in self._steps) / secs if secs > 0 else 0.0


def stats_snapshot(
    counters: EngineStats, cache: CacheManager, running: int, queued: int, rate: DecodeRate
) -> EngineStats:
    """A copy of `counters` with the gauges filled in (`counters` keeps them too, as the last snapshot's)."""
    s = counters
    s.num_running_reqs = running
    s.num_queue_reqs = queued
    total, free, cached, in_use = cache.page_counts()
    s.kv_pages_total, s.kv_pages_free, s.kv_pages_cached, s.kv_pages_in_use = total, free, cached, in_use
    s.token_usage = (total - free - cache.tree.evictable_pages) / total if total else 0.0
    st, sf, sc, su = cache.slot_counts()
    s.state_slots_total, s.state_slots_free, s.state_slots_cached, s.state_slots_in_use = st, sf, sc, su
    s.mamba_usage = su / st if st else 0.0
    s.cache_hit_rate = s.cached_tokens_total / s.prompt_tokens_total if s.prompt_tokens_total else 0.0
    s.kv_evictions = cache.tree.kv_evicted_pages
    s.state_evictions = cache.tree.states_evicted
    s.gen_throughput = rate.tokens_per_s()
    return EngineStats(**vars(s))
