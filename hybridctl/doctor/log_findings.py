"""A scanned log -> findings: pattern matches, a zero-sized state pool, a disabled or idle prefix cache."""

from __future__ import annotations

from hybridctl.doctor.findings import DoctorFinding
from hybridctl.doctor.log_scan import LogScan
from hybridctl.doctor.remedies import REMEDIES, RemedyInput

# Below this many prefills, "no prefix hits" says nothing (unique prompts are normal).
MIN_PREFILLS_FOR_MISS = 3


def log_findings(scan: LogScan, inp: RemedyInput) -> list[DoctorFinding]:
    out = []
    for m in scan.matches:
        fix, changes = REMEDIES[m.pattern.remedy](inp)
        if m.pattern.remedy == "grow_state_pool" and not changes:
            fix += _slots_from_log(scan)
        seen = f" Seen {m.count} times" if m.count > 1 else ""
        if m.ranks:
            seen += (" on " if seen else " Seen on ") + ", ".join(sorted(m.ranks))
        cause = m.pattern.cause + (seen + "." if seen else "")
        out.append(DoctorFinding(
            m.pattern.code, m.pattern.severity, cause, fix, changes, "log", m.line, m.evidence, m.count
        ))  # fmt: skip
    out += _startup_findings(scan, inp)
    return out


def _slots_from_log(scan: LogScan) -> str:
    """Without a config, the slot count the logged server needed, from its own start-up lines and args."""
    from hybridctl.planner.pool_sizing import PoolSizingError, slots_per_request

    running = max(scan.startup.max_running_requests or 0, 2)  # at least two requests' worth
    strategy = scan.server_args.get("mamba_radix_cache_strategy")
    if strategy not in ("no_buffer", "extra_buffer", "extra_buffer_lazy"):
        return ""
    try:
        per_request = slots_per_request(
            disable_radix_cache=scan.server_args.get("disable_radix_cache") == "True",
            strategy=strategy,
            overlap_schedule=scan.server_args.get("disable_overlap_schedule") != "True",
        )
    except PoolSizingError:
        return ""
    return (
        f" From this log: max_running_requests={running} at {per_request} slots per request ({strategy}) "
        f"needs --max-mamba-cache-size {running * per_request} (memory.max_mamba_cache_size)."
    )


def _startup_findings(scan: LogScan, inp: RemedyInput) -> list[DoctorFinding]:
    out = []
    info = scan.startup
    if info.mamba is not None and info.mamba.max_mamba_cache_size == 0:
        fix, changes = REMEDIES["grow_state_pool"](inp)
        fix += "" if changes else _slots_from_log(scan)
        out.append(DoctorFinding(
            "MAMBA_POOL_ALLOC", "error",
            "The recurrent-state pool was allocated with 0 slots: no request can hold a state, so every "
            "request fails or waits forever.",
            fix, changes, "log", scan.mamba_pool_line, "max_mamba_cache_size: 0",
        ))  # fmt: skip
    radix_off = scan.server_args.get("disable_radix_cache") == "True" or info.tree_cache_impl == "ChunkCache"
    if radix_off:
        fix, changes = REMEDIES["enable_prefix_cache"](inp)
        evidence = "disable_radix_cache=True" if scan.server_args.get("disable_radix_cache") == "True" else (
            "Tree cache initialized: impl=ChunkCache"
        )  # fmt: skip
        out.append(DoctorFinding(
            "PREFIX_CACHE_MISS", "warning",
            "The server ran with the radix cache disabled: no request reuses a cached prefix (KV or state).",
            fix, changes, "log", scan.server_args_line, evidence,
        ))  # fmt: skip
    elif scan.prefill_batches >= MIN_PREFILLS_FOR_MISS and scan.cached_tokens == 0:
        fix, changes = REMEDIES["enable_prefix_cache"](inp)
        out.append(DoctorFinding(
            "PREFIX_CACHE_MISS", "info",
            f"{scan.prefill_batches} prefill batches and not one cached token. Harmless if the prompts share "
            "nothing; if they share a prefix, the cache is not restoring recurrent state.",
            fix, changes, "log", scan.first_prefill_line, "#cached-token: 0",
        ))  # fmt: skip
    return out
