"""A scanned log -> findings, in the order the log shows them (first cause first).

The evidence, most specific first: message patterns (log_patterns.py), traceback signatures (log_signatures.py:
exception type + frames), message families (log_families.py: setting, state, refusal), an elastic stack active
before a crash in the pools' set-up, and the start-up numbers (a zero-sized state pool, the radix cache off).
Then the checks of log_evidence.py: a warning that predicts a miss must be confirmed by the prefills after it,
and a model without recurrent state withdraws the five codes. A fatal traceback or a process death that nothing
explains becomes UNKNOWN_FAILURE, naming the nearest code and why it was not assigned: no log that crashed passes
silently. Every finding carries its evidence in `basis`.
"""

from __future__ import annotations

import re
from dataclasses import replace

from hybridctl.doctor.findings import DoctorFinding
from hybridctl.doctor.log_evidence import (
    PRECURSORS,
    confirm_precursors,
    context_basis,
    family_of,
    gate_by_model,
    plugin_stack,
    traceback_basis,
    withheld_reason,
)
from hybridctl.doctor.log_families import match_family
from hybridctl.doctor.log_scan import LogScan
from hybridctl.doctor.log_signatures import Signature, match_traceback, nearest_code
from hybridctl.doctor.log_traceback import Traceback
from hybridctl.doctor.remedies import REMEDIES, RemedyInput
from hybridshared.sizing.pool_sizing import PoolSizingError, slots_per_request

# Below this many prefills, "no prefix hits" says nothing (unique prompts are normal).
MIN_PREFILLS_FOR_MISS = 3
UNKNOWN_FAILURE = "UNKNOWN_FAILURE"
# Informational notes: a deliberate or harmless state, never one of the five failure codes.
RADIX_CACHE_OFF = "RADIX_CACHE_OFF"
PREFIX_CACHE_IDLE = "PREFIX_CACHE_IDLE"
_NEAR = 2  # lines around a traceback whose message-pattern match explains it (the error logged beside it)


def log_findings(scan: LogScan, inp: RemedyInput) -> list[DoctorFinding]:
    context = context_basis(scan)
    out = []
    precursors: set[int] = set()
    for m in scan.matches:
        fix, changes = _fix(m.pattern.remedy, scan, inp)
        seen = f" Seen {m.count} times" if m.count > 1 else ""
        if m.ranks:
            seen += (" on " if seen else " Seen on ") + ", ".join(sorted(m.ranks))
        cause = m.pattern.cause + (seen + "." if seen else "")
        basis = (f"message: {m.pattern.id} ({m.pattern.code})", *_traceback_at(scan, m.line), *context)
        out.append(DoctorFinding(
            m.pattern.code, m.pattern.severity, cause, fix, changes, "log", m.line, m.evidence, m.count, basis
        ))  # fmt: skip
        if m.pattern.id in PRECURSORS:
            precursors.add(m.line)
    out += _traceback_findings(scan, inp, out, context)
    out += _error_line_findings(scan, inp, out, context)
    out += _startup_findings(scan, inp)
    out = confirm_precursors(out, scan, precursors)
    if any(f.line in precursors for f in out):
        out = [f for f in out if f.code != PREFIX_CACHE_IDLE]  # the idle prefills are that warning's effect
    out, withdrawn = gate_by_model(out, scan)
    out += _unexplained_death(scan, out, withdrawn, context)
    return sorted(out, key=lambda f: f.line or 0)


def _traceback_at(scan: LogScan, line: int) -> list[str]:
    """The exception and frames of the traceback a message line ends, if it ends one."""
    for tb in scan.tracebacks:
        if tb.start <= line <= tb.end and tb.frames:
            return traceback_basis(tb)
    return []


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

    args = scan.server_args
    running = max(scan.startup.max_running_requests or _int(args.get("max_running_requests")) or 0, 2)
    strategy = args.get("mamba_radix_cache_strategy") or args.get("mamba_scheduler_strategy")
    if strategy not in ("no_buffer", "extra_buffer", "extra_buffer_lazy"):
        have = scan.startup.mamba.max_mamba_cache_size if scan.startup.mamba else None
        if have:
            return (
                f" From this log: the pool held {have} slots for max_running_requests={running}; "
                f"raise the server's --max-mamba-cache-size above {have} or lower its --max-running-requests."
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
        f"needs the server's --max-mamba-cache-size {running * per_request} (memory.max_mamba_cache_size)."
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


def _traceback_findings(
    scan: LogScan, inp: RemedyInput, found: list[DoctorFinding], context: list[str]
) -> list[DoctorFinding]:
    """Tracebacks no message pattern explained: a signature (exception type + frames), else a message family
    in full (setting, state, constraint; the setting may come from the frames) on a traceback that killed the
    process."""
    out: list[DoctorFinding] = []
    done: set[tuple[str, str]] = set()
    for tb in scan.tracebacks:
        if tb.key() in done or _explained(tb, found + out):
            continue
        sig = match_traceback(tb)
        if sig is not None:
            done.add(tb.key())
            basis = (f"signature: {sig.id} ({sig.code})", *traceback_basis(tb), *context)
            out.append(_signature_finding(sig, tb, scan, inp, basis))
            continue
        fam = family_of(tb)
        # A transfer or an elastic move fails per request and the server goes on serving: still the failure.
        survivable = fam is not None and fam.family.code in ("PD_STATE_MISMATCH", "ELASTIC_TIMEOUT")
        if fam is None or not fam.full or not (tb.fatal or survivable) or not tb.exc_type:
            if (stack := plugin_stack(tb, scan)) is not None:
                done.add(tb.key())
                fix, changes = _fix("elastic_off", scan, inp)
                cause = (
                    "The server's elastic-memory stack failed while the memory pools were being set up, resized or "
                    f"resumed: {_exception_line(tb)[:200]} (raised in {_where(tb)})."
                )
                basis = (stack, *traceback_basis(tb), *context)
                out.append(DoctorFinding(
                    "ELASTIC_TIMEOUT", "error", cause, fix, changes, "log", tb.end, _exception_line(tb), 1, basis
                ))  # fmt: skip
            continue
        done.add(tb.key())
        fix, changes = _fix(fam.family.remedy, scan, inp)
        cause = f"{fam.family.cause} Raised in {_where(tb)}" + (f" on {tb.rank}." if tb.rank else ".")
        basis = (f"message family: {fam.describe()}", *traceback_basis(tb), *context)
        out.append(DoctorFinding(
            fam.family.code, "error", cause, fix, changes, "log", tb.end, _exception_line(tb), 1, basis
        ))  # fmt: skip
    return out


def _error_line_findings(
    scan: LogScan, inp: RemedyInput, found: list[DoctorFinding], context: list[str]
) -> list[DoctorFinding]:
    """Error lines outside any traceback ("Prefill transfer failed ... with exception ...") that carry a message
    family in full: one finding per code, at its first line."""
    inside = [(tb.start, tb.end) for tb in scan.tracebacks]
    out: list[DoctorFinding] = []
    for number, evidence, message in scan.errors:
        if any(a <= number <= b for a, b in inside):
            continue
        fam = match_family(message)
        if fam is None or not fam.full:
            continue
        code = fam.family.code
        if any(f.code == code and abs((f.line or 0) - number) <= _NEAR for f in found + out):
            continue
        same = next((f for f in out if f.code == code), None)
        if same is not None:
            out[out.index(same)] = replace(same, count=same.count + 1)
            continue
        fix, changes = _fix(fam.family.remedy, scan, inp)
        basis = (f"message family: {fam.describe()}", *context)
        out.append(DoctorFinding(code, "error", fam.family.cause, fix, changes, "log", number, evidence, 1, basis))
    return out


def _exception_line(tb: Traceback) -> str:
    text = f"{tb.exc_type}: {tb.message}" if tb.message else tb.exc_type
    return text[:400]


def _where(tb: Traceback) -> str:
    frame = tb.innermost_sglang_frame()
    return f"{frame.module}.{frame.func}" if frame else "no frame in the log"


def _signature_finding(
    sig: Signature, tb: Traceback, scan: LogScan, inp: RemedyInput, basis: tuple[str, ...]
) -> DoctorFinding:
    fix, changes = _fix(sig.remedy, scan, inp)
    cause = f"{sig.cause} Raised in {_where(tb)}" + (f" on {tb.rank}." if tb.rank else ".")
    return DoctorFinding(sig.code, "error", cause, fix, changes, "log", tb.end, _exception_line(tb), 1, basis)


def _unexplained_death(
    scan: LogScan, found: list[DoctorFinding], withdrawn: list[DoctorFinding], context: list[str]
) -> list[DoctorFinding]:
    """A crash that no known failure explains still gets a finding: UNKNOWN_FAILURE, once per distinct crash,
    naming the exception, the innermost SGLang frame, the nearest code and why it was not assigned."""
    if any(f.severity == "error" for f in found):
        return []
    out: list[DoctorFinding] = []
    done: set[tuple[str, str]] = set()
    for tb in scan.tracebacks:
        if not tb.fatal or tb.key() in done or not tb.exc_type or _explained(tb, found):
            continue
        done.add(tb.key())
        near, reason = withheld_reason(tb, scan, withdrawn)
        if near is None:
            near = nearest_code(tb)
            reason = "not assigned: its frames and message use that mode's words, but fit none of its families"
        hint = f" Nearest known failure mode: {near} ({reason})." if near else " It looks unrelated to hybrid serving."
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
        basis = (*traceback_basis(tb), *context, *([f"nearest code: {near}; {reason}"] if near else []))
        out.append(DoctorFinding(
            UNKNOWN_FAILURE, "error", cause, fix, (), "log", tb.end, _exception_line(tb), 1, basis
        ))  # fmt: skip
    if not out and not found and (scan.deaths and not scan.startup.ready or _died_at_end(scan)):
        death = scan.deaths[-1]
        out.append(DoctorFinding(
            UNKNOWN_FAILURE, "error",
            f"A server process exited abnormally ({death.text[:200]}) and the log names no known cause.",
            "Look above this line for the first error of any rank; hybridctl doctor --config checks the pools.",
            (), "log", death.line, death.text, 1, tuple(context),
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
