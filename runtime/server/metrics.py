"""Prometheus text with SGLang's metric names, from the engine's stats and the server's request timings.

Gauges and token counters come from the engine (`EngineStats`), so /metrics and /server_info report the same
numbers; latency histograms are measured here, where requests arrive and answers leave. Bucket bounds and
labels (model_name, engine_type, is_streaming) are SGLang 0.5.23's: SGLang dashboards read these as is.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

from runtime.core.requests import EngineStats

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (*TTFT_BUCKETS, 600, 1200, 1800, 2400)
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
    0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip


@dataclass
class Histogram:
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


@dataclass
class RequestTimings:
    """Latency histograms per is_streaming label value ("true"/"false"), as SGLang splits them."""

    ttft: dict[str, Histogram] = field(default_factory=dict)
    e2e: dict[str, Histogram] = field(default_factory=dict)
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe_request(
        self, streaming: bool, ttft: float | None, e2e: float, token_times: list[float]
    ) -> None:
        label = "true" if streaming else "false"
        with self.lock:
            if ttft is not None:
                self.ttft.setdefault(label, Histogram(TTFT_BUCKETS)).observe(ttft)
            self.e2e.setdefault(label, Histogram(E2E_BUCKETS)).observe(e2e)
            for a, b in zip(token_times, token_times[1:], strict=False):
                self.itl.observe(b - a)


def _labels(base: dict[str, str], **extra: str) -> str:
    merged = {**base, **extra}
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in merged.items())
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(value: float) -> str:
    if float(value).is_integer():
        return f"{float(value):.1f}"
    return repr(float(value))


def _histogram_lines(name: str, doc: str, series: dict[str, Histogram], base: dict[str, str]) -> list[str]:
    lines = [f"# HELP {name} {doc}", f"# TYPE {name} histogram"]
    for label, h in sorted(series.items()):
        extra = {"is_streaming": label} if label else {}
        cumulative = 0
        for bound, count in zip((*h.buckets, float("inf")), h.counts, strict=True):
            cumulative += count
            le = "+Inf" if bound == float("inf") else _fmt(bound)
            lines.append(f"{name}_bucket{_labels(base, **extra, le=le)} {_fmt(cumulative)}")
        lines.append(f"{name}_sum{_labels(base, **extra)} {_fmt(h.total)}")
        lines.append(f"{name}_count{_labels(base, **extra)} {_fmt(h.n)}")
    return lines


def _elastic_lines(stats: EngineStats, base: dict[str, str]) -> list[str]:
    series = [
        ("runtime:elastic_kv_pool_tokens", "gauge", "KV tokens the elastic pool holds now.",
         stats.max_total_num_tokens),
        ("runtime:elastic_state_pool_slots", "gauge", "State slots the elastic pool holds now.",
         stats.max_mamba_cache_size),
        ("runtime:elastic_moves_total", "counter", "Chunks moved between the KV and state pools.",
         stats.elastic_moves_total),
        ("runtime:elastic_realloc_timeouts_total", "counter", "Elastic moves abandoned at the deadline.",
         stats.elastic_realloc_timeouts_total),
    ]  # fmt: skip
    lines: list[str] = []
    for name, kind, doc, value in series:
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name}{_labels(base)} {_fmt(value)}"]
    return lines


def render_metrics(stats: EngineStats, timings: RequestTimings, model_name: str) -> str:
    base = {"model_name": model_name, "engine_type": "unified"}
    gauges: list[tuple[str, str, float]] = [
        ("num_running_reqs", "The number of running requests.", stats.num_running_reqs),
        ("num_queue_reqs", "The number of requests in the waiting queue.", stats.num_queue_reqs),
        ("gen_throughput", "The generation throughput (token/s).", stats.gen_throughput),
        ("cache_hit_rate", "The prefix cache hit rate.", stats.cache_hit_rate),
        ("token_usage", "The token usage.", stats.token_usage),
        ("mamba_usage", "The token usage for Mamba layers.", stats.mamba_usage),
        (
            "max_total_num_tokens",
            "Maximum total number of tokens in the KV cache pool.",
            stats.max_total_num_tokens,
        ),
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
    lines: list[str] = []
    for short, doc, value in gauges:
        name = f"sglang:{short}"
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name}{_labels(base)} {_fmt(value)}"]
    counters: list[tuple[str, str, float]] = [
        ("prompt_tokens_total", "Number of prefill tokens processed.", stats.prompt_tokens_total),
        ("generation_tokens_total", "Number of generation tokens processed.", stats.generation_tokens_total),
        ("num_requests_total", "Number of requests processed.", stats.num_requests_total),
        ("num_aborted_requests_total", "Number of requests aborted.", stats.num_requests_aborted),
        (
            "spec_verify_calls_total",
            "Number of speculative decoding verification calls.",
            stats.spec_verify_calls_total,
        ),
    ]
    for short, doc, value in counters:
        name = f"sglang:{short}"
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} counter", f"{name}{_labels(base)} {_fmt(value)}"]
    if stats.elastic_mode:  # runtime/kvcache/elastic_pool.py: the split moves, scrapes show it over time
        lines += _elastic_lines(stats, base)
    name = "sglang:cached_tokens_total"
    lines += [
        f"# HELP {name} Number of cached prompt tokens by source (device/host/storage).",
        f"# TYPE {name} counter",
        f"{name}{_labels(base, cache_source='device')} {_fmt(stats.cached_tokens_total)}",
    ]
    with timings.lock:
        lines += _histogram_lines(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            timings.ttft,
            base,
        )
        lines += _histogram_lines(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            timings.e2e,
            base,
        )
        lines += _histogram_lines(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            {"": timings.itl},
            base,
        )
    return "\n".join(lines) + "\n"
