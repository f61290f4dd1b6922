"""`verify spec`: how many tokens each speculative verify step accepts, against the configured ceiling.

Two independent measurements: per request from meta_info (completion_tokens / spec_verify_ct), and server-wide from
`/metrics` deltas over the same requests (generation tokens / verify calls). The ceiling is steps + 1 (every draft
accepted plus the bonus token). `/server_info`'s avg_spec_accept_length is a server-lifetime average, so it is reported
before and after, not judged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridctl.config.schema import HybridConfig
from hybridctl.verify.client import SGLangClient
from hybridctl.verify.prometheus import MetricsSnapshot, counter_delta
from hybridctl.verify.report import CheckResult
from hybridshared.units import format_number

_PROMPTS = (
    "Count from one to thirty in words:",
    "List the days of the week, then the months of the year:",
    "Write the alphabet, one letter per line:",
    "Repeat the sentence 'the cache holds the state' five times:",
)


@dataclass
class SpecOptions:
    requests: int = 4
    max_new_tokens: int = 64
    min_accept_length: float = 1.5


def _spec_enabled(value: Any) -> bool:
    return value not in (None, "", "none", "None", "NONE")


def _avg_accept(server_info: dict[str, Any]) -> float | None:
    states = server_info.get("internal_states") or []
    raw = [s.get("avg_spec_accept_length") for s in states if isinstance(s, dict)]
    values = [float(v) for v in raw if isinstance(v, int | float)]
    return sum(values) / len(values) if values else None


def judge_spec(
    per_request: list[tuple[int, int]],
    *,
    algorithm: str,
    steps: int | None,
    metrics_accept: float | None,
    options: SpecOptions,
) -> tuple[list[str], dict[str, Any]]:
    """(reasons, measurements) from (completion_tokens, spec_verify_ct) pairs; pure."""
    reasons: list[str] = []
    counted = [(c, v) for c, v in per_request if v > 0]
    ceiling = None if steps is None else steps + 1
    measured = {
        "algorithm": algorithm,
        "steps": steps,
        "ceiling": ceiling,
        "per_request_accept_length": [round(c / v, 3) for c, v in counted],
        "accept_length": None,
        "metrics_accept_length": metrics_accept,
        "min_accept_length": options.min_accept_length,
    }
    if not counted:
        reasons.append(
            f"the server runs {algorithm} but no response carried meta_info.spec_verify_ct > 0: speculative "
            "decoding is configured yet never verified a draft (draft model not loaded, or disabled at "
            "run time)"
        )
        return reasons, measured
    accept = sum(c for c, _ in counted) / sum(v for _, v in counted)
    measured["accept_length"] = round(accept, 3)
    # completion_tokens also counts the token each request's prefill produced, outside any verify round, so a
    # request may legitimately show (steps + 1) + 1 / spec_verify_ct.
    bound = None if ceiling is None else ceiling + len(counted) / sum(v for _, v in counted)
    if bound is not None and accept > bound + 1e-6:
        reasons.append(
            f"accept length {accept:.2f} exceeds the ceiling {ceiling} (steps {steps} + 1): the server's "
            "accounting of spec_verify_ct is wrong"
        )
    elif accept < options.min_accept_length:
        reasons.append(
            f"accept length {accept:.2f} < {options.min_accept_length} (ceiling {ceiling}): most drafts "
            "are rejected "
            "— check the draft model matches the target (speculative_draft_model_path), and that the "
            "state sandbox "
            "(enable_mamba_state_sandbox) is on; NEXTN with the radix cache under KV pressure is a "
            "known cause"
        )
    if metrics_accept is not None and abs(metrics_accept - accept) > 0.1 * accept:
        reasons.append(
            f"/metrics says accept length {metrics_accept:.2f} over the same requests, meta_info says "
            f"{accept:.2f}: "
            "the two accountings disagree by more than 10%"
        )
    return reasons, measured


def _internal_total(server_info: dict[str, Any], key: str) -> float | None:
    states = [s for s in server_info.get("internal_states") or [] if isinstance(s, dict)]
    values = [float(s[key]) for s in states if isinstance(s.get(key), int | float)]
    return sum(values) if values else None


def server_accept_length(
    metrics: tuple[MetricsSnapshot | None, MetricsSnapshot | None],
    info: tuple[dict[str, Any], dict[str, Any]],
) -> tuple[float | None, str | None]:
    """Server-side accept length over the check's requests: Δ generation tokens / Δ verify calls, and the
    source.

    Verify calls come from `/metrics` (sglang:spec_verify_calls_total) or, when the server does not export
    that
    counter, from `/server_info` internal_states' spec_verify_calls_total before/after.
    """
    before, after = metrics
    if before is None or after is None:
        return None, None
    tokens = counter_delta(before, after, "sglang:generation_tokens_total")
    verifies = counter_delta(before, after, "sglang:spec_verify_calls_total")
    source = "/metrics"
    if not verifies:
        start, end = (
            _internal_total(info[0], "spec_verify_calls_total"),
            _internal_total(info[1], "spec_verify_calls_total"),
        )
        verifies = None if start is None or end is None else end - start
        source = "/metrics generation tokens, /server_info verify calls"
    if not tokens or not verifies:
        return None, None
    return tokens / verifies, source


def run_spec(client: SGLangClient, config: HybridConfig | None, options: SpecOptions | None = None) -> CheckResult:
    opts = options or SpecOptions()
    info_before = client.server_info()
    algorithm = info_before.get("speculative_algorithm")
    configured = config.config.speculative if config is not None else None
    if not _spec_enabled(algorithm):
        if configured is not None and configured.speculative_algorithm != "none":
            reason = (
                f"config.toml sets speculative_algorithm = {configured.speculative_algorithm!r} but the "
                "server runs without speculative decoding: restart it on this config with `hybridctl stop`, then "
                "`hybridctl launch`"
            )
            return CheckResult("spec", "failed", reason, [reason])
        reason = "skipped: the server runs without speculative decoding (no speculative_algorithm)"
        return CheckResult("spec", "skipped", reason, [reason])
    notes: list[str] = []
    steps = info_before.get("speculative_num_steps")
    if not isinstance(steps, int):
        steps = configured.speculative_num_steps if configured is not None else None
        if steps is None:
            notes.append(
                "/server_info reports no resolved speculative_num_steps (SGLang does): the ceiling steps + 1 "
                "was not checked; pass --config to take steps from config.toml"
            )
        else:
            notes.append(f"/server_info reports no resolved speculative_num_steps: steps {steps} from config.toml")
    metrics_before = client.metrics()
    per_request: list[tuple[int, int]] = []
    for i in range(opts.requests):
        out = client.generate(_PROMPTS[i % len(_PROMPTS)], max_new_tokens=opts.max_new_tokens)
        meta = out["meta_info"]
        per_request.append((int(meta.get("completion_tokens", 0) or 0), int(meta.get("spec_verify_ct", 0) or 0)))
    metrics_after = client.metrics()
    info_after = client.server_info()
    server_accept, source = server_accept_length((metrics_before, metrics_after), (info_before, info_after))
    reasons, measured = judge_spec(
        per_request, algorithm=str(algorithm), steps=steps, metrics_accept=server_accept, options=opts
    )
    measured["server_accept_length_source"] = source
    measured["server_avg_accept_length_before"] = _avg_accept(info_before)
    measured["server_avg_accept_length_after"] = _avg_accept(info_after)
    if server_accept is None:
        notes.append("no server-side accept length: /metrics is off or lacks the spec counters")
    if reasons:
        return CheckResult("spec", "failed", reasons[0], reasons, notes, measured)
    ceiling = measured["ceiling"]
    summary = f"{algorithm}: accept length {format_number(measured['accept_length'])}" + (
        f" of at most {format_number(ceiling)}" if ceiling is not None else ""
    )
    if server_accept is not None:
        summary += f" (server: {server_accept:.2f})"
    return CheckResult("spec", "passed", summary, [], notes, measured)
