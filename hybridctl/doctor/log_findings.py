"""A scanned log -> findings, in the order the log shows them (first cause first).

Three layers: message patterns (log_patterns.py), traceback signatures (log_signatures.py: exception type +
frames), and the start-up numbers (a zero-sized state pool, the radix cache off). A fatal traceback or a process
death that none of them explains becomes UNKNOWN_FAILURE: no log that crashed passes silently.
"""

from __future__ import annotations

import re

from hybridctl.doctor.findings import DoctorFinding
from hybridctl.doctor.log_scan import LogScan
from hybridctl.doctor.log_signatures import Signature, match_traceback, nearest_code
from hybridctl.doctor.log_traceback import Traceback
from hybridctl.doctor.remedies import REMEDIES, RemedyInput

# Below this many prefills, "no prefix hits" says nothing (unique prompts are normal).
MIN_PREFILLS_FOR_MISS = 3
UNKNOWN_FAILURE = "UNKNOWN_FAILURE"
# Informational notes: a deliberate or harmless state, never one of the five failure codes.
RADIX_CACHE_OFF = "RADIX_CACHE_OFF"
PREFIX_CACHE_IDLE = "PREFIX_CACHE_IDLE"
_NEAR = 2  # lines around a traceback whose message-pattern match explains it (the error logged beside it)


def log_findings(scan: LogScan, inp: RemedyInput) -> list[DoctorFinding]:
    out = []
    for m in scan.matches:
        fix, changes = _fix(m.pattern.remedy, scan, inp)
        seen = f" Seen {m.count} times" if m.count > 1 else ""
        if m.ranks:
            seen += (" on " if seen else " Seen on ") + ", ".join(sorted(m.ranks))
        cause = m.pattern.cause + (seen + "." if seen else "")
        out.append(DoctorFinding(
            m.pattern.code, m.pattern.severity, cause, fix, changes, "log", m.line, m.evidence, m.count
        ))  # fmt: skip
    out += _traceback_findings(scan, inp, out)
    out += _startup_findings(scan, inp)
    out += _unexplained_death(scan, out)
    return sorted(out, key=lambda f: f.line or 0)


def _fix(remedy: str, scan: LogScan, inp: RemedyInput) -> tuple[str, tuple]:
    fix, changes = REMEDIES[remedy](inp)
    if remedy == "grow_state_pool" and not changes:
        fix += _slots_from_log(scan)
    return fix + _cli_spelling(remedy, scan), changes


def _cli_spelling(remedy: str, scan: LogScan) -> str:
    """The same fix as the logged server's own command line spells it (old releases: old flag names)."""
    flag = scan.dialect.strategy()
    who = scan.dialect.describe()
    if remedy in ("spec_extra_buffer", "pd_strategy"):
        env = " with SGLANG_ENABLE_SPEC_V2=1" if remedy == "spec_extra_buffer" else ""
        return f" On {who}'s command line: {flag} extra_buffer{env}."
    if remedy == "prefix_page_size":
        return f" On {who}'s command line: --page-size 1, or {flag} extra_buffer to keep a larger page."
    return ""


def _slots_from_log(scan: LogScan) -> str:
    """Without a config, the slot count the logged server needed, from its own start-up lines and args."""
    from hybridctl.planner.pool_sizing import PoolSizingError, slots_per_request

    args = scan.server_args
    running = max(scan.startup.max_running_requests or _int(args.get("max_running_requests")) or 0, 2)
    strategy = args.get("mamba_radix_cache_strategy") or args.get("mamba_scheduler_strategy")
    if strategy not in ("no_buffer", "extra_buffer", "extra_buffer_lazy"):
        have = scan.startup.mamba.max_mamba_cache_size if scan.startup.mamba else None
        if have:
            return (
                f" From this log: the pool held {have} slots for max_running_requests={running}; "
                f"raise --max-mamba-cache-size above {have} or lower --max-running-requests."
            )
        return ""
    try:
        per_request = slots_per_request(
            disable_radix_cache=args.get("disable_radix_cache") == "True",
            strategy=strategy,
            overlap_schedule=args.get("disable_overlap_schedule") != "True",
        )
    except PoolSizingError:
        return ""
    return (
        f" From this log: max_running_requests={running} at {per_request} slots per request ({strategy}) "
        f"needs --max-mamba-cache-size {running * per_request} (memory.max_mamba_cache_size)."
    )


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and re.fullmatch(r"\d+", text) else None


def _explained(tb: Traceback, found: list[DoctorFinding]) -> bool:
    """A finding inside the traceback, or an error logged right beside it, already says what it is."""
    for f in found:
        if f.line is None:
            continue
        if tb.start <= f.line <= tb.end:
            return True
        if f.severity == "error" and tb.start - _NEAR <= f.line <= tb.end + _NEAR:
            return True
    return False


def _traceback_findings(scan: LogScan, inp: RemedyInput, found: list[DoctorFinding]) -> list[DoctorFinding]:
    out: list[DoctorFinding] = []
    done: set[tuple[str, str]] = set()
    for tb in scan.tracebacks:
        if tb.key() in done or _explained(tb, found + out):
            continue
        sig = match_traceback(tb)
        if sig is None:
            continue
        done.add(tb.key())
        out.append(_signature_finding(sig, tb, scan, inp))
    return out


def _exception_line(tb: Traceback) -> str:
    text = f"{tb.exc_type}: {tb.message}" if tb.message else tb.exc_type
    return text[:400]


def _where(tb: Traceback) -> str:
    frame = tb.innermost_sglang_frame()
    return f"{frame.module}.{frame.func}" if frame else "no frame in the log"


def _signature_finding(sig: Signature, tb: Traceback, scan: LogScan, inp: RemedyInput) -> DoctorFinding:
    fix, changes = _fix(sig.remedy, scan, inp)
    cause = f"{sig.cause} Raised in {_where(tb)}" + (f" on {tb.rank}." if tb.rank else ".")
    return DoctorFinding(sig.code, "error", cause, fix, changes, "log", tb.end, _exception_line(tb))


def _unexplained_death(scan: LogScan, found: list[DoctorFinding]) -> list[DoctorFinding]:
    """A crash that no known failure explains still gets a finding: UNKNOWN_FAILURE, once per distinct crash."""
    if any(f.severity == "error" for f in found):
        return []
    out: list[DoctorFinding] = []
    done: set[tuple[str, str]] = set()
    for tb in scan.tracebacks:
        if not tb.fatal or tb.key() in done or not tb.exc_type or _explained(tb, found):
            continue
        done.add(tb.key())
        near = nearest_code(tb)
        hint = f" Nearest known failure mode: {near}." if near else " It looks unrelated to hybrid serving."
        cause = (
            f"The server died of {_exception_line(tb)[:240]} (innermost SGLang frame: {_where(tb)}); it matches "
            f"none of the five hybrid failure modes.{hint}"
        )
        fix = (
            "Read the exception and its innermost frame; if the server is hybrid-specific, re-run with "
            "hybridctl doctor --config to check the pools and options."
        )
        if near:
            fix += f" For {near}: " + REMEDIES[_NEAR_REMEDY[near]](RemedyInput(None))[0]
        out.append(DoctorFinding(UNKNOWN_FAILURE, "error", cause, fix, (), "log", tb.end, _exception_line(tb)))
    if not out and not found and (scan.deaths and not scan.startup.ready or _died_at_end(scan)):
        death = scan.deaths[-1]
        out.append(DoctorFinding(
            UNKNOWN_FAILURE, "error",
            f"A server process exited abnormally ({death.text[:200]}) and the log names no known cause.",
            "Look above this line for the first error of any rank; hybridctl doctor --config checks the pools.",
            (), "log", death.line, death.text,
        ))  # fmt: skip
    return out


def _died_at_end(scan: LogScan) -> bool:
    return bool(scan.deaths) and scan.deaths[-1].line >= scan.lines - 3


_NEAR_REMEDY = {
    "MAMBA_POOL_ALLOC": "grow_state_pool",
    "PREFIX_CACHE_MISS": "enable_prefix_cache",
    "SPEC_ROLLBACK": "spec_extra_buffer",
    "ELASTIC_TIMEOUT": "elastic_off",
    "PD_STATE_MISMATCH": "pd_match_peer",
}


def _startup_findings(scan: LogScan, inp: RemedyInput) -> list[DoctorFinding]:
    out = []
    info = scan.startup
    if info.mamba is not None and info.mamba.max_mamba_cache_size == 0:
        fix, changes = _fix("grow_state_pool", scan, inp)
        out.append(DoctorFinding(
            "MAMBA_POOL_ALLOC", "error",
            "The recurrent-state pool was allocated with 0 slots: no request can hold a state, so every "
            "request fails or waits forever.",
            fix, changes, "log", scan.mamba_pool_line, "max_mamba_cache_size: 0",
        ))  # fmt: skip
    radix_off = scan.server_args.get("disable_radix_cache") == "True" or info.tree_cache_impl == "ChunkCache"
    if radix_off:
        # A deliberate choice (often right: unique prompts, PD prefill): an informational note, not a failure.
        fix, changes = REMEDIES["enable_prefix_cache"](inp)
        evidence = "disable_radix_cache=True" if scan.server_args.get("disable_radix_cache") == "True" else (
            "Tree cache initialized: impl=ChunkCache"
        )  # fmt: skip
        out.append(DoctorFinding(
            RADIX_CACHE_OFF, "info",
            "The server ran with the radix cache disabled, by choice: no request reuses a cached prefix (KV or "
            "state). Fine for prompts that share nothing; for shared prefixes turn it on.",
            "If prompts share prefixes: " + fix, changes, "log", scan.server_args_line, evidence,
        ))  # fmt: skip
    elif scan.prefill_batches >= MIN_PREFILLS_FOR_MISS and scan.cached_tokens == 0:
        fix, changes = REMEDIES["enable_prefix_cache"](inp)
        out.append(DoctorFinding(
            PREFIX_CACHE_IDLE, "info",
            f"{scan.prefill_batches} prefill batches and not one cached token. Harmless if the prompts share "
            "nothing; if they share a prefix, the cache is not restoring recurrent state (PREFIX_CACHE_MISS).",
            fix, changes, "log", scan.first_prefill_line, "#cached-token: 0",
        ))  # fmt: skip
    return out
