"""`doctor --url`: judge the five failure modes from what a running server serves (SGLang's or the bundled
runtime's): `/server_info` (or `/get_server_info` before 0.4.7), `/metrics`, and one repeated prompt.

Reading goes through hybridctl.verify's client and Prometheus parser; judging (`live_findings`) is pure, so the
same snapshot always gives the same findings, in the log's findings format (source "live").

What each mode looks like from outside:
- MAMBA_POOL_ALLOC: the state pool is (nearly) full while requests queue, or it has no slot at all, or
  allocations failed;
- PREFIX_CACHE_MISS: the same prompt sent three times is never served from the cache (cached_tokens 0);
  a server run with the radix cache off gets an informational note instead;
- SPEC_ROLLBACK: the accept length sits far below its ceiling (steps + 1) after enough verify rounds;
- ELASTIC_TIMEOUT: elastic moves abandoned at their deadline (or any elastic/VMM failure counter);
- PD_STATE_MISMATCH: transfer failure counters, or a PD server aborting requests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from hybridctl.doctor.findings import DoctorFinding
from hybridctl.verify.client import ServerError, ServerUnreachable, SGLangClient
from hybridctl.verify.prometheus import MetricsParseError, MetricsSnapshot
from hybridctl.verify.runner import TargetError, resolve_target

SATURATED = 0.95  # state-pool usage at which a queue means requests wait for slots
MIN_VERIFY_ROUNDS = 8  # fewer verify rounds say nothing about the accept length
PROBE_REPEATS = 3
# Long enough to cross SGLang's default 256-token state checkpoint interval (extra_buffer) and a large page.
PROBE_WORDS = 700


class LiveError(Exception):
    """The server could not be read (unreachable, not an SGLang-style API): one line for the user."""


@dataclass
class LiveSnapshot:
    url: str
    server_info: dict[str, Any]
    metrics: MetricsSnapshot | None = None
    probe_cached: list[int] = field(default_factory=list)  # cached_tokens of each repeat of one prompt
    probe_error: str | None = None

    def value(self, key: str) -> float | None:
        """A number from internal_states (summed over ranks' first), else the top level, else sglang:<key>."""
        states = [s for s in self.server_info.get("internal_states") or [] if isinstance(s, dict)]
        for state in states[:1]:
            if isinstance(state.get(key), int | float) and not isinstance(state.get(key), bool):
                return float(state[key])
        top = self.server_info.get(key)
        if isinstance(top, int | float) and not isinstance(top, bool):
            return float(top)
        if self.metrics is not None:
            return self.metrics.total(f"sglang:{key}")
        return None

    def arg(self, key: str) -> Any:
        return self.server_info.get(key)

    def counters(self, pattern: str) -> list[tuple[str, float]]:
        """Metric totals whose names match `pattern` and are above zero."""
        if self.metrics is None:
            return []
        rx = re.compile(pattern, re.IGNORECASE)
        names = [n for n in self.metrics.samples if rx.search(n) and not n.endswith(("_bucket", "_sum"))]
        return [(n, v) for n in names if (v := self.metrics.total(n) or 0.0) > 0]


def read_live(url: str, timeout_s: float = 60.0, probe: bool = True, api_key_env: str | None = None) -> LiveSnapshot:

    try:
        target = resolve_target(url, None, api_key_env, timeout_s=timeout_s)
    except TargetError as exc:
        raise LiveError(str(exc)) from None
    with SGLangClient(target) as client:
        try:
            info = client.server_info_any()
        except (ServerUnreachable, ServerError) as exc:
            raise LiveError(str(exc)) from None
        snap = LiveSnapshot(target.url, info if isinstance(info, dict) else {})
        try:
            snap.metrics = client.metrics()
        except (ServerError, MetricsParseError):
            snap.metrics = None  # SGLang without --enable-metrics: judge from /server_info alone
        if probe and not _radix_off(snap):
            prompt = " ".join(f"w{i % 97}" for i in range(PROBE_WORDS)) + " Summarise."
            try:
                for _ in range(PROBE_REPEATS):
                    out = client.generate(prompt, max_new_tokens=1)
                    snap.probe_cached.append(int(out["meta_info"].get("cached_tokens") or 0))
            except (ServerUnreachable, ServerError, KeyError, TypeError, ValueError) as exc:
                snap.probe_error = str(exc)[:300]
        if probe:
            try:
                snap.server_info = client.server_info_any()  # counters after the probe
                snap.metrics = client.metrics() if snap.metrics is not None else None
            except (ServerUnreachable, ServerError, MetricsParseError):
                pass
    return snap


def _radix_off(snap: LiveSnapshot) -> bool:
    return snap.arg("disable_radix_cache") is True or snap.arg("radix_cache_enabled") is False


def _f(code: str, severity: str, cause: str, fix: str, evidence: str) -> DoctorFinding:
    return DoctorFinding(code, severity, cause, fix, (), "live", None, evidence)  # type: ignore[arg-type]


def live_findings(snap: LiveSnapshot) -> list[DoctorFinding]:
    return [*_state_pool(snap), *_prefix(snap), *_spec(snap), *_elastic(snap), *_pd(snap)]


def _state_pool(snap: LiveSnapshot) -> list[DoctorFinding]:
    slots, usage = snap.value("max_mamba_cache_size"), snap.value("mamba_usage")
    queue, failures = snap.value("num_queue_reqs") or 0, snap.value("num_allocation_failures") or 0
    fix = (
        "Give the state pool more slots: raise memory.max_mamba_cache_size / memory.mamba_full_memory_ratio "
        "(the server's --max-mamba-cache-size / --mamba-full-memory-ratio), or lower "
        "runtime.max_running_requests (--max-running-requests); hybridctl doctor --config computes the value."
    )
    if slots == 0:
        return [_f("MAMBA_POOL_ALLOC", "error", "The server's recurrent-state pool has 0 slots: no request can "
                   "run.", fix, "max_mamba_cache_size: 0")]  # fmt: skip
    if usage is not None and usage >= SATURATED and queue > 0:
        return [_f("MAMBA_POOL_ALLOC", "error",
                   f"The state pool is saturated (mamba_usage {usage:.2f}) while {int(queue)} requests queue: "
                   "they wait for state slots, not for KV.", fix,
                   f"mamba_usage={usage:.2f}, num_queue_reqs={int(queue)}, max_mamba_cache_size={slots}")]  # fmt: skip
    if failures > 0:
        return [_f("MAMBA_POOL_ALLOC", "error", f"{int(failures)} state-slot allocations failed on this server.",
                   fix, f"num_allocation_failures={int(failures)}")]  # fmt: skip
    return []


def _prefix(snap: LiveSnapshot) -> list[DoctorFinding]:
    if _radix_off(snap):
        return [_f("RADIX_CACHE_OFF", "info",
                   "The server runs with the radix cache disabled, by choice: no request reuses a cached prefix.",
                   "If prompts share prefixes, restart without the server's --disable-radix-cache "
                   "(runtime.disable_radix_cache = false).", "disable_radix_cache=True")]  # fmt: skip
    if len(snap.probe_cached) >= 2 and max(snap.probe_cached[1:]) == 0:
        strategy = snap.arg("mamba_radix_cache_strategy") or snap.arg("mamba_scheduler_strategy")
        return [_f("PREFIX_CACHE_MISS", "error",
                   f"The same ~{PROBE_WORDS}-word prompt sent {len(snap.probe_cached)} times was never served "
                   "from the prefix cache (cached_tokens 0 each time): cached KV without its recurrent state "
                   "is useless, so every request recomputes the prompt.",
                   "Turn state snapshots on (mamba.state_snapshot_on_match = true); on SGLang use "
                   "--mamba-radix-cache-strategy extra_buffer (older: --mamba-scheduler-strategy) with a page "
                   "size it supports.",
                   f"cached_tokens per repeat: {snap.probe_cached}; strategy: {strategy}")]  # fmt: skip
    return []


def _spec(snap: LiveSnapshot) -> list[DoctorFinding]:
    algorithm = snap.arg("speculative_algorithm")
    if algorithm in (None, "", "none", "None", "NONE"):
        return []
    rounds = snap.value("spec_verify_calls_total") or 0
    accept = snap.value("avg_spec_accept_length") or snap.value("spec_accept_length")
    steps, drafts = snap.arg("speculative_num_steps"), snap.arg("speculative_num_draft_tokens")
    ceiling = steps + 1 if isinstance(steps, int) else drafts if isinstance(drafts, int) else None
    if accept is None or ceiling is None or rounds < MIN_VERIFY_ROUNDS or ceiling <= 1:
        return []
    if accept > 1 + 0.3 * (ceiling - 1):
        return []
    severity = "error" if accept <= 1.05 else "warning"
    return [_f("SPEC_ROLLBACK", severity,
               f"Speculative decoding ({algorithm}) accepts {accept:.2f} tokens per verify round against a ceiling "
               f"of {ceiling}: drafts are rejected, which on a hybrid model points at recurrent state that is not "
               "rolled back to the last accepted token.",
               "Keep a state per draft position: speculative.enable_mamba_state_sandbox = true; on SGLang "
               "--mamba-radix-cache-strategy extra_buffer with SGLANG_ENABLE_SPEC_V2=1 and "
               "--speculative-eagle-topk 1.",
               f"accept length {accept:.2f}, ceiling {ceiling}, verify rounds {int(rounds)}")]  # fmt: skip


def _elastic(snap: LiveSnapshot) -> list[DoctorFinding]:
    failed = snap.counters(r"(elastic|unified|vmm|kvcached).*(timeout|fail|error)")
    if not failed:
        return []
    words = ", ".join(f"{n}={v:g}" for n, v in failed)
    return [_f("ELASTIC_TIMEOUT", "error",
               "The elastic pool abandoned moves between the KV and state pools at their deadline (or its VMM "
               "calls failed): the split the load needs is not reached.",
               "Set memory.enable_elastic_memory_pool = false (a fixed split) or raise the realloc timeout; "
               "check the driver supports CUDA VMM.", words)]  # fmt: skip


def _pd(snap: LiveSnapshot) -> list[DoctorFinding]:
    failed = snap.counters(r"(transfer|bootstrap|disagg|kv_send|kv_recv).*(fail|error|timeout|abort)")
    mode = snap.arg("disaggregation_mode")
    fix = "Use the same model, state dtype (mamba.state_dtype) and TP size on the prefill and decode servers."
    if failed:
        words = ", ".join(f"{n}={v:g}" for n, v in failed)
        return [_f("PD_STATE_MISMATCH", "error", "PD transfers between prefill and decode are failing.", fix,
                   words)]  # fmt: skip
    aborted = snap.value("num_aborted_requests_total") or snap.value("num_requests_aborted") or 0
    if mode in ("prefill", "decode") and aborted > 0:
        return [_f("PD_STATE_MISMATCH", "warning",
                   f"This {mode} server aborted {int(aborted)} requests: in PD that is how a failed KV/state "
                   "transfer ends.", fix, f"disaggregation_mode={mode}, aborted={int(aborted)}")]  # fmt: skip
    return []
