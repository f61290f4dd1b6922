"""/metrics text as prometheus_client writes it, read back by the parser verify, bench and doctor use.

Checks SGLang's names, labels (model_name, engine_type, is_streaming) and bucket bounds, and that a model name
with quotes and backslashes round-trips: the exposition escapes it and the parser unescapes it.
"""

from __future__ import annotations

from hybridctl.verify.prometheus import parse_metrics
from runtime.core.requests import EngineStats
from runtime.server.metrics import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS, RequestTimings, render_metrics

MODEL = 'org/m "v2" \\ test'


def _scrape(elastic: bool) -> str:
    stats = EngineStats(num_running_reqs=3, prompt_tokens_total=120, cached_tokens_total=40, cache_hit_rate=0.25)
    stats.elastic_mode = elastic
    timings = RequestTimings()
    timings.observe_request(True, 0.15, 0.5, [1.0, 1.003, 1.013])
    timings.observe_request(False, None, 700.0, [])
    return render_metrics(stats, timings, MODEL)


def test_names_labels_and_values_round_trip() -> None:
    snap = parse_metrics(_scrape(elastic=False))
    base = {"model_name": MODEL, "engine_type": "unified"}
    assert snap.total("sglang:num_running_reqs", **base) == 3.0
    assert snap.total("sglang:prompt_tokens_total", **base) == 120.0
    assert snap.total("sglang:cached_tokens_total", cache_source="device", **base) == 40.0
    assert snap.total("sglang:cache_hit_rate") == 0.25
    assert not any(name.startswith("runtime:elastic") for name in snap.samples)
    assert not any(name.endswith("_created") for name in snap.samples)  # SGLang's scrape has none either


def test_histograms_keep_sglang_buckets_and_streaming_split() -> None:
    snap = parse_metrics(_scrape(elastic=True))
    for name, bounds in (
        ("sglang:time_to_first_token_seconds", TTFT_BUCKETS),
        ("sglang:e2e_request_latency_seconds", E2E_BUCKETS),
        ("sglang:inter_token_latency_seconds", ITL_BUCKETS),
    ):
        les = {dict(s.labels)["le"] for s in snap.samples[name + "_bucket"]}
        assert les == {*(str(float(b)) for b in bounds), "+Inf"}, name
    assert snap.total("sglang:e2e_request_latency_seconds_count", is_streaming="true") == 1.0
    assert snap.total("sglang:e2e_request_latency_seconds_count", is_streaming="false") == 1.0
    # 700 s lands above 400 s (the last TTFT bound) but within E2E's 1200 s bucket, cumulative as Prometheus wants.
    assert snap.total("sglang:e2e_request_latency_seconds_bucket", is_streaming="false", le="600.0") == 0.0
    assert snap.total("sglang:e2e_request_latency_seconds_bucket", is_streaming="false", le="1200.0") == 1.0
    assert snap.total("sglang:time_to_first_token_seconds_count") == 1.0  # the non-streamed request had none
    assert snap.total("sglang:inter_token_latency_seconds_count") == 2.0
    assert snap.total("sglang:inter_token_latency_seconds_bucket", le="0.004") == 1.0
    assert "is_streaming" not in dict(snap.samples["sglang:inter_token_latency_seconds_count"][0].labels)
    assert snap.total("runtime:elastic_moves_total") == 0.0
    assert snap.total("runtime:elastic_kv_pool_tokens") is not None
