"""The live judge (`doctor --url`) over /server_info bodies and /metrics texts in the shapes SGLang and the bundled
runtime serve, parsed by hybridctl.verify's own Prometheus parser. The live server tests are in
tests/runtime/test_doctor_live_url.py; these cover the modes a loopback server cannot be pushed into on demand."""

from __future__ import annotations

from hybridctl.doctor.live import LiveSnapshot, live_findings
from hybridctl.verify.prometheus import parse_metrics


def metrics(**values: float) -> str:
    lines = []
    for name, value in values.items():
        lines += [f"# TYPE {name} gauge", f'{name}{{model_name="m"}} {value}']
    return "\n".join(lines) + "\n"


def judge(info: dict, text: str | None = None, probe: list[int] | None = None) -> list[tuple[str, str]]:
    snap = LiveSnapshot("http://127.0.0.1:30000", info, parse_metrics(text) if text else None, probe or [])
    return [(f.code, f.severity) for f in live_findings(snap)]


def test_a_saturated_state_pool_with_a_queue_is_an_error_and_without_a_queue_is_fine() -> None:
    info = {"max_mamba_cache_size": 24}
    busy = metrics(**{"sglang:mamba_usage": 0.99, "sglang:num_queue_reqs": 7})
    assert judge(info, busy) == [("MAMBA_POOL_ALLOC", "error")]
    assert judge(info, metrics(**{"sglang:mamba_usage": 0.99, "sglang:num_queue_reqs": 0})) == []
    internal = {"max_mamba_cache_size": 24, "internal_states": [{"mamba_usage": 1.0, "num_queue_reqs": 3}]}
    assert judge(internal) == [("MAMBA_POOL_ALLOC", "error")]  # SGLang without --enable-metrics


def test_repeated_prompt_never_cached_is_a_prefix_miss_and_radix_off_a_note() -> None:
    assert judge({}, probe=[0, 0, 0]) == [("PREFIX_CACHE_MISS", "error")]
    assert judge({}, probe=[0, 640, 640]) == []
    assert judge({"disable_radix_cache": True}) == [("RADIX_CACHE_OFF", "info")]


def test_accept_length_far_below_its_ceiling() -> None:
    info = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3}
    low = {**info, "internal_states": [{"avg_spec_accept_length": 1.01, "spec_verify_calls_total": 400}]}
    assert judge(low) == [("SPEC_ROLLBACK", "error")]
    mid = {**info, "internal_states": [{"avg_spec_accept_length": 1.6, "spec_verify_calls_total": 400}]}
    assert judge(mid) == [("SPEC_ROLLBACK", "warning")]
    good = {**info, "internal_states": [{"avg_spec_accept_length": 3.1, "spec_verify_calls_total": 400}]}
    assert judge(good) == []
    few = {**info, "internal_states": [{"avg_spec_accept_length": 1.0, "spec_verify_calls_total": 2}]}
    assert judge(few) == []  # two rounds say nothing


def test_elastic_timeouts_and_pd_transfer_failures() -> None:
    assert judge({}, metrics(**{"runtime:elastic_realloc_timeouts_total": 3})) == [("ELASTIC_TIMEOUT", "error")]
    assert judge({}, metrics(**{"runtime:elastic_realloc_timeouts_total": 0})) == []
    assert judge({}, metrics(**{"sglang:kv_transfer_failed_reqs_total": 2})) == [("PD_STATE_MISMATCH", "error")]
    aborted = metrics(**{"sglang:num_aborted_requests_total": 5})
    assert judge({"disaggregation_mode": "decode"}, aborted) == [("PD_STATE_MISMATCH", "warning")]
    assert judge({"disaggregation_mode": "null"}, aborted) == []
