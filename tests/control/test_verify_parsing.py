"""Parsers verify and bench rely on: SGLang's /metrics text and its streamed /generate SSE lines."""

from __future__ import annotations

import json

import pytest

from hybridctl.verify.client import ServerError, StreamTracker, parse_sse_data
from hybridctl.verify.prometheus import MetricsParseError, counter_delta, histogram_mean_delta, parse_metrics

BEFORE = """\
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m",engine_type="unified"} 0.25
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m",is_streaming="true"} 1000.0
sglang:prompt_tokens_total{model_name="m",is_streaming="false"} 500.0
sglang:time_to_first_token_seconds_sum{model_name="m",is_streaming="true"} 2.0
sglang:time_to_first_token_seconds_count{model_name="m",is_streaming="true"} 10.0
sglang:time_to_first_token_seconds_bucket{model_name="m",le="+Inf",is_streaming="true"} 10.0
"""

AFTER = """\
sglang:cache_hit_rate{model_name="m",engine_type="unified"} 0.5
sglang:prompt_tokens_total{model_name="m",is_streaming="true"} 1800.0
sglang:prompt_tokens_total{model_name="m",is_streaming="false"} 500.0
sglang:cached_tokens_total{model_name="m",cache_source="device"} 640.0
sglang:time_to_first_token_seconds_sum{model_name="m",is_streaming="true"} 2.5
sglang:time_to_first_token_seconds_count{model_name="m",is_streaming="true"} 14.0
"""


def test_metrics_totals_and_deltas() -> None:
    before, after = parse_metrics(BEFORE), parse_metrics(AFTER)
    assert before.total("sglang:cache_hit_rate") == 0.25
    assert before.total("sglang:prompt_tokens_total") == 1500.0
    assert before.total("sglang:prompt_tokens_total", is_streaming="false") == 500.0
    assert counter_delta(before, after, "sglang:prompt_tokens_total") == 800.0
    # A labelled counter that first appears after the first scrape counts from zero.
    assert counter_delta(before, after, "sglang:cached_tokens_total") == 640.0
    assert counter_delta(before, after, "sglang:not_exported") is None
    mean, count = histogram_mean_delta(before, after, "sglang:time_to_first_token_seconds")  # type: ignore[misc]
    assert count == 4 and mean == pytest.approx(0.125)
    assert histogram_mean_delta(after, after, "sglang:time_to_first_token_seconds") is None


def test_metrics_label_values_with_escapes_and_timestamps() -> None:
    snap = parse_metrics('x_total{path="/a\\"b",code="200"} 3 1700000000000\nup 1\n')
    sample = snap.samples["x_total"][0]
    # Label values are unescaped (`\"` is `"`), so a match on a model name with quotes finds its samples.
    assert dict(sample.labels) == {"path": '/a"b', "code": "200"} and sample.value == 3.0
    assert snap.total("x_total", path='/a"b') == 3.0
    assert snap.total("up") == 1.0


def test_metrics_garbage_is_a_clear_error() -> None:
    with pytest.raises(MetricsParseError, match="line 2"):
        parse_metrics("ok 1\nthis is not a metric line at all\n")
    with pytest.raises(MetricsParseError, match="not a number"):
        parse_metrics("x abc\n")


def _chunk(text: str, completion_tokens: int, **meta: object) -> str:
    return "data: " + json.dumps({"text": text, "meta_info": {"completion_tokens": completion_tokens, **meta}})


def test_stream_tracker_ttft_itl_and_done() -> None:
    tracker = StreamTracker(start=10.0)
    tracker.feed(": keep-alive comment", 10.1)
    tracker.feed(_chunk("", 0), 10.2)  # no token yet: not the first token
    tracker.feed(_chunk("He", 1, prompt_tokens=7, cached_tokens=3), 10.5)
    tracker.feed(_chunk("Hello", 3), 10.9)  # two tokens in one chunk: the gap is split between them
    tracker.feed(_chunk("Hello", 3), 11.0)  # repeated count: no new token
    tracker.feed("data: [DONE]", 11.1)
    result = tracker.finish(11.2)
    assert result.ttft_s == pytest.approx(0.5)
    assert result.itl_s == pytest.approx([0.2, 0.2])
    assert result.chunks == 4 and result.saw_done
    assert result.text == "Hello" and result.completion_tokens == 3
    assert result.e2e_s == pytest.approx(1.2)


def test_sse_error_chunk_and_non_object() -> None:
    assert parse_sse_data("") is None and parse_sse_data("data: [DONE]") is None
    with pytest.raises(ServerError, match="mid-stream"):
        parse_sse_data('data: {"error": {"message": "boom"}}')
    with pytest.raises(ServerError, match="not a JSON object"):
        parse_sse_data("data: [1, 2]")
