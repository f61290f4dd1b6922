"""SGLang's /metrics, with its metric names, from the engine's stats and the server's request timings.

Gauges and token counters come from the engine (`EngineStats`), so /metrics and /server_info report the same
numbers; latency histograms are measured here, where requests arrive and answers leave. Bucket bounds and
labels (model_name, engine_type, is_streaming) are SGLang 0.5.23's: SGLang dashboards read these as is.
The text itself is prometheus_client's (what SGLang serves /metrics with): one collector reads a stats snapshot
per scrape, so the values are the engine's, not copies kept in step with it.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from runtime.core.requests import EngineStats

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (*TTFT_BUCKETS, 600, 1200, 1800, 2400)
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
    0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
BASE_LABELS = ("model_name", "engine_type")
_TTFT_DOC = "Histogram of time to first token in seconds."
_E2E_DOC = "Histogram of End-to-end request latency in seconds"  # SGLang's wording, no full stop
_ITL_DOC = "Histogram of inter-token latency in seconds."


@dataclass
class Histogram:
    """Per-bucket counts under the server's lock; the collector turns them into Prometheus' cumulative buckets."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)  # the last is +Inf

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, count) pairs as HistogramMetricFamily takes them, +Inf last."""
        pairs: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += count
            pairs.append(("+Inf" if bound == float("inf") else str(float(bound)), float(running)))
        return pairs


@dataclass
class RequestTimings:
    """Latency histograms per is_streaming label value ("true"/"false"), as SGLang splits them."""

    ttft: dict[str, Histogram] = field(default_factory=dict)
    e2e: dict[str, Histogram] = field(default_factory=dict)
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe_request(self, streaming: bool, ttft: float | None, e2e: float, token_times: list[float]) -> None:
        label = "true" if streaming else "false"
        with self.lock:
            if ttft is not None:
                self.ttft.setdefault(label, Histogram(TTFT_BUCKETS)).observe(ttft)
            self.e2e.setdefault(label, Histogram(E2E_BUCKETS)).observe(e2e)
            for a, b in zip(token_times, token_times[1:], strict=False):
                self.itl.observe(b - a)


def _gauges(stats: EngineStats) -> list[tuple[str, str, float]]:
    return [
        ("num_running_reqs", "The number of running requests.", stats.num_running_reqs),
        ("num_queue_reqs", "The number of requests in the waiting queue.", stats.num_queue_reqs),
        ("gen_throughput", "The generation throughput (token/s).", stats.gen_throughput),
        ("cache_hit_rate", "The prefix cache hit rate.", stats.cache_hit_rate),
        ("token_usage", "The token usage.", stats.token_usage),
        ("mamba_usage", "The token usage for Mamba layers.", stats.mamba_usage),
        ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", stats.max_total_num_tokens),
        (
            "spec_accept_length",
            "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
            stats.spec_accept_length,
        ),
        (
            "spec_accept_rate",
            "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).",
            stats.spec_accept_rate,
        ),
    ]


def _counters(stats: EngineStats) -> list[tuple[str, str, float]]:
    return [
        ("prompt_tokens_total", "Number of prefill tokens processed.", stats.prompt_tokens_total),
        ("generation_tokens_total", "Number of generation tokens processed.", stats.generation_tokens_total),
        ("num_requests_total", "Number of requests processed.", stats.num_requests_total),
        ("num_aborted_requests_total", "Number of requests aborted.", stats.num_requests_aborted),
        ("spec_verify_calls_total", "Number of speculative decoding verification calls.",
         stats.spec_verify_calls_total),
    ]  # fmt: skip


def _elastic(stats: EngineStats) -> list[tuple[str, str, str, float]]:
    return [
        ("runtime:elastic_kv_pool_tokens", "gauge", "KV tokens the elastic pool holds now.",
         stats.max_total_num_tokens),
        ("runtime:elastic_state_pool_slots", "gauge", "State slots the elastic pool holds now.",
         stats.max_mamba_cache_size),
        ("runtime:elastic_moves_total", "counter", "Chunks moved between the KV and state pools.",
         stats.elastic_moves_total),
        ("runtime:elastic_realloc_timeouts_total", "counter", "Elastic moves abandoned at the deadline.",
         stats.elastic_realloc_timeouts_total),
    ]  # fmt: skip


class SnapshotCollector(Collector):
    """One scrape's metric families: the engine's stats snapshot and the request latency histograms."""

    def __init__(self, stats: EngineStats, timings: RequestTimings, model_name: str) -> None:
        self.stats = stats
        self.timings = timings
        self.base = [model_name, "unified"]

    def collect(self) -> Iterator[Metric]:
        for short, doc, value in _gauges(self.stats):
            yield self._one(GaugeMetricFamily(f"sglang:{short}", doc, labels=BASE_LABELS), value)
        for short, doc, value in _counters(self.stats):
            yield self._one(CounterMetricFamily(f"sglang:{short}", doc, labels=BASE_LABELS), value)
        if self.stats.elastic_mode:  # runtime/kvcache/elastic_pool.py: the split moves, scrapes show it over time
            for name, kind, doc, value in _elastic(self.stats):
                family = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
                yield self._one(family(name, doc, labels=BASE_LABELS), value)
        forks = CounterMetricFamily(
            "runtime:state_forks_total",
            "n > 1 continuations forked off one prefill (a recurrent-state slot copy each; KV shared).",
            labels=BASE_LABELS,
        )
        yield self._one(forks, self.stats.state_forks)
        cached = CounterMetricFamily(
            "sglang:cached_tokens_total",
            "Number of cached prompt tokens by source (device/host/storage).",
            labels=(*BASE_LABELS, "cache_source"),
        )
        cached.add_metric([*self.base, "device"], self.stats.cached_tokens_total)
        yield cached
        t = self.timings
        with t.lock:
            yield self._histogram("sglang:time_to_first_token_seconds", _TTFT_DOC, t.ttft)
            yield self._histogram("sglang:e2e_request_latency_seconds", _E2E_DOC, t.e2e)
            yield self._histogram("sglang:inter_token_latency_seconds", _ITL_DOC, {"": t.itl})

    def _one(self, family: GaugeMetricFamily | CounterMetricFamily, value: float) -> Metric:
        family.add_metric(self.base, value)
        return family

    def _histogram(self, name: str, doc: str, series: dict[str, Histogram]) -> Metric:
        """`series` maps an is_streaming value to its histogram; the key "" means the metric has no such label."""
        streaming = any(series)
        family = HistogramMetricFamily(name, doc, labels=(*BASE_LABELS, "is_streaming") if streaming else BASE_LABELS)
        for label, h in sorted(series.items()):
            values = [*self.base, label] if streaming else self.base
            family.add_metric(values, h.cumulative(), sum_value=h.total)
        return family


def render_metrics(stats: EngineStats, timings: RequestTimings, model_name: str) -> str:
    """Prometheus text exposition (format 0.0.4, what SGLang serves) of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(stats, timings, model_name))
    return generate_latest(registry).decode("utf-8")
