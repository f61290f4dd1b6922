"""Aggregate a load run: latency distributions, throughput, cache hit rate, accept length, and how the client's numbers
compare with the server's own `/metrics` over the same interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridctl.bench.loadgen import LoadRun
from hybridctl.verify.prometheus import MetricsSnapshot, counter_delta, histogram_mean_delta
from hybridctl.verify.stats import summarize


def _ms(values: list[float]) -> dict[str, float | int] | None:
    s = summarize([v * 1000.0 for v in values])
    return None if s is None else {k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.to_dict().items()}


def _relative_diff(client: float | None, server: float | None) -> float | None:
    if client is None or server is None or server == 0:
        return None
    return abs(client - server) / abs(server)


@dataclass
class BenchResult:
    config: dict[str, Any]
    completed: int
    failed: int
    errors: list[str]
    duration_s: float
    latency_ms: dict[str, dict[str, float | int] | None]
    throughput: dict[str, float]
    cache: dict[str, float | None]
    accept_length: float | None
    concurrency: dict[str, float | int | None]
    server: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    run: LoadRun | None = field(default=None, repr=False)  # raw records, for --plot; not in the JSON

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "completed": self.completed,
            "failed": self.failed,
            "errors": self.errors[:10],
            "duration_s": round(self.duration_s, 4),
            "latency_ms": self.latency_ms,
            "throughput": self.throughput,
            "cache": self.cache,
            "accept_length": self.accept_length,
            "concurrency": self.concurrency,
            "server": self.server,
            "notes": self.notes,
        }


def server_comparison(
    before: MetricsSnapshot,
    after: MetricsSnapshot,
    duration_s: float,
    client_ttft_mean_s: float | None,
    client_output_tok_s: float,
) -> dict[str, Any]:
    """The server's own numbers over the run, and their relative difference from the client's."""
    ttft = histogram_mean_delta(before, after, "sglang:time_to_first_token_seconds")
    e2e = histogram_mean_delta(before, after, "sglang:e2e_request_latency_seconds")
    gen = counter_delta(before, after, "sglang:generation_tokens_total")
    prompt = counter_delta(before, after, "sglang:prompt_tokens_total")
    cached = counter_delta(before, after, "sglang:cached_tokens_total")
    if cached is None and prompt is not None:
        cached = 0.0
    server_tok_s = None if gen is None or duration_s <= 0 else gen / duration_s
    return {
        "ttft_mean_ms": None if ttft is None else round(ttft[0] * 1000.0, 3),
        "ttft_observations": None if ttft is None else ttft[1],
        "e2e_mean_ms": None if e2e is None else round(e2e[0] * 1000.0, 3),
        "output_tokens": gen,
        "output_throughput_tok_s": None if server_tok_s is None else round(server_tok_s, 3),
        "cache_hit_rate": None if not prompt or cached is None else round(cached / prompt, 4),
        "cache_hit_rate_gauge": after.total("sglang:cache_hit_rate"),
        "ttft_relative_diff": _relative_diff(client_ttft_mean_s, None if ttft is None else ttft[0]),
        # The client's excess in ms: HTTP and stream delivery are a few ms whatever the prefill, so a short TTFT's
        # relative difference alone reads large.
        "ttft_diff_ms": (
            None if ttft is None or client_ttft_mean_s is None else round((client_ttft_mean_s - ttft[0]) * 1000.0, 3)
        ),
        "throughput_relative_diff": _relative_diff(client_output_tok_s, server_tok_s),
    }


def summarize_run(
    run: LoadRun, config: dict[str, Any], before: MetricsSnapshot | None, after: MetricsSnapshot | None
) -> BenchResult:
    ok = [r for r in run.records if r.ok]
    bad = [r for r in run.records if not r.ok]
    out_tokens = sum(r.completion_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens or r.prompt_len for r in ok)
    duration = max(run.duration_s, 1e-9)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    verify = sum(r.spec_verify_ct for r in ok)
    prompt_reported = sum(r.prompt_tokens for r in ok)
    result = BenchResult(
        config=config,
        completed=len(ok),
        failed=len(bad),
        errors=[r.error or "unknown" for r in bad],
        duration_s=run.duration_s,
        latency_ms={
            "ttft": _ms(ttfts),
            "tpot": _ms([t for r in ok if (t := r.tpot_s) is not None]),
            "itl": _ms([x for r in ok for x in r.itl_s]),
            "e2e": _ms([r.e2e_s for r in ok]),
        },
        throughput={
            "request_per_s": round(len(ok) / duration, 4),
            "input_tok_per_s": round(in_tokens / duration, 3),
            "output_tok_per_s": round(out_tokens / duration, 3),
            "total_tok_per_s": round((in_tokens + out_tokens) / duration, 3),
        },
        cache={
            "cached_tokens": float(sum(r.cached_tokens for r in ok)),
            "prompt_tokens": float(prompt_reported),
            "hit_rate": None if not prompt_reported else round(sum(r.cached_tokens for r in ok) / prompt_reported, 4),
        },
        accept_length=None if verify == 0 else round(out_tokens / verify, 4),
        concurrency={
            "requested": config.get("max_concurrency"),
            "client_max_in_flight": run.max_in_flight,
            "server_max_running": run.server_max_running,
        },
        run=run,
    )
    if before is not None and after is not None:
        mean_ttft = sum(ttfts) / len(ttfts) if ttfts else None
        result.server = server_comparison(before, after, run.duration_s, mean_ttft, out_tokens / duration)
    else:
        result.notes.append("/metrics not available (SGLang: --enable-metrics): no comparison with the server")
    return result
