"""Judgements of verify on recorded numbers: thresholds, named reasons, notes, and the JSON shape."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hybridctl.verify.prefix_judge import OptionsError, PrefixCacheOptions, Request, Trial, judge_prefix_cache
from hybridctl.verify.report import CheckResult, VerifyReport, unreachable_report
from hybridctl.verify.spec import SpecOptions, judge_spec

DOC = 1000


def _trials(
    cold_ms: list[float],
    warm_ms: list[float],
    cached: list[list[int]] | int,
    identical_cached: int | None = None,
) -> list[Trial]:
    trials = []
    for i, (c, w) in enumerate(zip(cold_ms, warm_ms, strict=True)):
        series = cached[i] if isinstance(cached, list) else [cached, cached]
        ident = identical_cached if identical_cached is not None else (series[-1] + 24 if series[-1] else 0)
        trials.append(
            Trial(
                cold=Request(ttft_s=c / 1000, cached_tokens=0, prompt_tokens=DOC + 24),
                realistic=[Request(ttft_s=w / 1000, cached_tokens=n, prompt_tokens=DOC + 24) for n in series],
                identical=[Request(ttft_s=w / 1000 * 0.9, cached_tokens=ident, prompt_tokens=DOC + 24)] * 2,
            )
        )
    return trials


def _judge(trials: list[Trial], server_args: dict[str, Any] | None = None, **kw: Any) -> CheckResult:
    return judge_prefix_cache(
        trials,
        document_tokens=DOC,
        document_tokens_exact=True,
        options=PrefixCacheOptions(**kw),
        server_args=server_args or {},
        metrics=None,
        flush_refusals=[],
        tokenizer_note="exact ids",
    )


def test_clear_hit_passes_with_ratio_and_ci() -> None:
    result = _judge(_trials([100, 105, 98, 110, 102], [30, 31, 29, 35, 30], DOC))
    assert result.status == "passed", result.reasons
    real = result.measurements["realistic"]["ratio"]
    assert real["ci_low"] <= real["ratio"] <= real["ci_high"] < 0.8
    assert result.measurements["cold_ttft_ms"]["median"] == pytest.approx(102.0)
    assert "warm/cold TTFT 0.29" in result.summary


def test_cache_off_fails_and_names_the_switches() -> None:
    result = _judge(_trials([100, 101, 99], [100, 99, 102], 0), {"disable_radix_cache": True})
    assert result.status == "failed"
    assert "cached_tokens was 0 on every warm request" in result.reasons[0]
    assert "disable_radix_cache" in result.reasons[0] and "enable_prefix_caching" in result.reasons[0]
    assert "the server reports disable_radix_cache=true" in result.reasons[0]


def test_cache_on_but_no_buffer_never_hitting_names_the_strategy() -> None:
    args = {"disable_radix_cache": False, "mamba_radix_cache_strategy": "no_buffer"}
    result = _judge(_trials([100, 101], [99, 100], 0), args)
    assert result.status == "failed"
    assert "mamba_radix_cache_strategy=no_buffer" in result.reasons[0] and "extra_buffer" in result.reasons[0]


def test_hits_without_speedup_fail_with_the_ratio() -> None:
    result = _judge(_trials([10, 11, 10], [9.5, 10, 9.8], DOC))
    assert result.status == "failed"
    assert "warm/cold median TTFT" in result.reasons[0] and "> 0.8" in result.reasons[0]


def test_threshold_flag_changes_the_verdict() -> None:
    trials = _trials([10, 11, 10], [7.5, 8, 7.8], DOC)
    assert _judge(trials).status == "passed"
    assert _judge(trials, max_ratio=0.5).status == "failed"


def test_partial_match_names_the_track_interval() -> None:
    trials = _trials([100, 100, 100], [60, 60, 60], 768, identical_cached=768)
    result = _judge(trials, {"mamba_radix_cache_strategy": "extra_buffer", "mamba_track_interval": 256})
    assert result.status == "failed"
    assert "fewer than 900 tokens" in result.reasons[0]
    assert "every 256 tokens" in result.reasons[0]


def test_no_buffer_first_miss_is_a_note_not_a_failure() -> None:
    trials = _trials([100, 100, 100], [30, 31, 29], [[0, DOC], [0, DOC], [0, DOC]])
    result = _judge(trials)
    assert result.status == "passed", result.reasons
    assert any("no_buffer" in n and "3/3" in n for n in result.notes)


def test_cold_hits_mean_the_measurement_is_invalid() -> None:
    trials = _trials([30, 30], [30, 30], DOC)
    trials[0].cold = Request(ttft_s=0.03, cached_tokens=DOC, prompt_tokens=DOC + 24)
    result = _judge(trials)
    assert result.status == "failed" and "cold request(s) already hit the cache" in result.reasons[0]


def test_options_are_validated_with_flag_names() -> None:
    with pytest.raises(OptionsError, match="--questions must be >= 2"):
        PrefixCacheOptions(questions=1).validate()
    with pytest.raises(OptionsError, match="--max-ratio"):
        PrefixCacheOptions(max_ratio=0).validate()


def test_spec_judgement() -> None:
    reasons, m = judge_spec(
        [(64, 20), (64, 16)], algorithm="EAGLE", steps=3, metrics_accept=None, options=SpecOptions()
    )
    assert reasons == [] and m["accept_length"] == pytest.approx(128 / 36, abs=1e-3) and m["ceiling"] == 4
    reasons, _ = judge_spec(
        [(64, 60)], algorithm="EAGLE", steps=3, metrics_accept=None, options=SpecOptions()
    )
    assert "most drafts are rejected" in reasons[0]
    reasons, _ = judge_spec(
        [(64, 10)], algorithm="EAGLE", steps=3, metrics_accept=None, options=SpecOptions()
    )
    assert "exceeds the ceiling 4" in reasons[0]
    # A short request whose drafts were all accepted: 4 per verify round plus the prefill's token.
    reasons, m = judge_spec([(5, 1)], algorithm="EAGLE", steps=3, metrics_accept=None, options=SpecOptions())
    assert reasons == [] and m["accept_length"] == 5.0
    reasons, _ = judge_spec([(64, 0)], algorithm="EAGLE", steps=3, metrics_accept=None, options=SpecOptions())
    assert "spec_verify_ct" in reasons[0]
    reasons, _ = judge_spec([(60, 20)], algorithm="EAGLE", steps=3, metrics_accept=2.0, options=SpecOptions())
    assert "disagree" in reasons[0]


def test_report_json_shape_and_skipped_semantics() -> None:
    report = VerifyReport(
        url="http://x",
        checks=[
            CheckResult("basic", "passed", "ok"),
            CheckResult("spec", "skipped", "no spec", ["no spec"]),
        ],
    )
    data = json.loads(json.dumps(report.to_dict()))
    assert data["passed"] is True and data["url"] == "http://x"
    assert [c["name"] for c in data["checks"]] == ["basic", "spec"]
    assert set(data["checks"][0]) == {"name", "status", "summary", "reasons", "notes", "measurements"}
    report.checks.append(CheckResult("prefix-cache", "failed", "bad", ["bad"]))
    assert report.to_dict()["passed"] is False
    assert VerifyReport(url="u", checks=[CheckResult("spec", "skipped", "s")]).passed is False
    assert unreachable_report("u", "down") == {"passed": False, "url": "u", "error": "down", "checks": []}


def test_server_args_comparison_notes_caps_and_flags_real_mismatches() -> None:
    from hybridctl.config.schema import HybridConfig
    from hybridctl.verify.basic import compare_server_args, expected_server_args

    cfg = HybridConfig()
    cfg.settings.runtime.max_running_requests = 64
    expected = expected_server_args(cfg)
    server = {"disable_radix_cache": False, "chunked_prefill_size": 8192, "max_running_requests": 48,
              "schedule_policy": "fcfs"}  # fmt: skip
    mismatches, notes = compare_server_args(server, expected)
    assert mismatches == []  # spec off and not reported by the server: consistent
    assert any("capped max_running_requests to 48" in n for n in notes)
    mismatches, _ = compare_server_args(
        {**server, "max_running_requests": 128, "disable_radix_cache": True}, expected
    )
    assert len(mismatches) == 2 and any("disable_radix_cache: server has true" in m for m in mismatches)
