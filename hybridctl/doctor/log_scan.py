"""Read a server log (SGLang 0.5.x or the bundled runtime) into data: failure-pattern matches, start-up pool
sizes, prefix-cache statistics. Pure text processing; turning matches into fixes is diagnose.py's job.

Logs come with ANSI colours, "[2026-01-02 10:00:00 TP0] " prefixes, several ranks interleaved and tracebacks
whose last line repeats the message; the same failure is reported once, at its first line, with a count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from hybridctl.doctor.log_patterns import PATTERNS, LogPattern
from hybridctl.doctor.log_traceback import Death, Traceback, TracebackReader, strip_launcher
from hybridctl.logs.dialect import LogDialect, read_dialect
from hybridctl.logs.startup import StartupInfo, parse_startup

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# SGLang's configure_logger: "[%(asctime)s{.ms}{ prefix}] message", prefix like " TP0" or " DP1 TP3".
_PREFIX = re.compile(
    r"^\[(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)(?P<ranks>(?: [A-Z]{1,4}\d+)*)\]\s?"
)
# Other prefixes pasted logs carry: docker compose ("sglang-1  | "), vLLM-style ("ERROR 11-13 11:03:06
# [core.py:708] "), Python logging ("2026-03-02 11:21:07,512 - ERROR - ", "2026-03-02 11:21:07 ERROR ").
_COMPOSE = re.compile(r"^[\w.-]+\s+\|\s?")
_OTHER_PREFIX = re.compile(
    r"^(?:(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\]\s?"
    r"|\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\s*(?:-\s*)?(?:[\w.]+\s+-\s+)?"
    r"(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\s*[-:]?\s)"
)
_MAX_EVIDENCE = 400
# One pass over a healthy line instead of one per pattern: most lines of a long log match nothing.
_ANY_PATTERN = re.compile("|".join(f"(?:{p.regex.pattern})" for p in PATTERNS), re.IGNORECASE)
# Substrings of the lines hybridctl/logs/startup.py parses.
# A line that calls itself harmless (torch_memory_saver: "cuMemCreate CUDA_ERROR_OUT_OF_MEMORY (may not be an
# issue e.g. torch allocator will free cache and retry)") is not evidence of a failure by itself.
_BENIGN = re.compile(r"may not be an issue|can (?:safely )?be ignored|safe to ignore|is harmless", re.IGNORECASE)
_STARTUP_KEYS = ("Cache is allocated", "max_total_num_tokens=", "Tree cache initialized", "fired up and")

_PREFILL = re.compile(r"Prefill batch.*?#new-token: (\d+), #cached-token: (\d+)")
# server_args is logged as a dict repr ('key': value) in 0.5.2x and as ServerArgs(key=value) before.
_ARG = re.compile(r"['\"]?\b(disable_radix_cache|page_size|mamba_radix_cache_strategy|mamba_scheduler_strategy|"
                  r"speculative_algorithm|disaggregation_mode|enable_unified_memory|disable_overlap_schedule|"
                  r"max_running_requests|max_mamba_cache_size|mamba_full_memory_ratio|tp_size)['\"]?\s*[:=]\s*"
                  r"('[^']*'|\"[^\"]*\"|[\w.]+)")
# The same choice written as a command-line flag (a launch command pasted into the log).
_FLAG = re.compile(r"--(disable-radix-cache|mamba-(?:radix-cache|scheduler)-strategy|max-running-requests|"
                   r"max-mamba-cache-size|speculative-algorithm|tp-size|tp)\b(?:[ =]+([\w.]+))?")


def startup_summary(info: StartupInfo) -> dict[str, int | None]:
    """The three start-up numbers `doctor --json` reports."""
    kv_tokens = info.max_total_num_tokens
    if kv_tokens is None and info.kv:
        kv_tokens = info.kv[0].tokens
    return {
        "max_mamba_cache_size": info.mamba.max_mamba_cache_size if info.mamba else None,
        "kv_tokens": kv_tokens,
        "max_running_requests": info.max_running_requests,
    }


@dataclass
class LogMatch:
    pattern: LogPattern
    line: int  # 1-based, first occurrence
    evidence: str
    count: int = 1  # lines that said it (ranks, repeats), not counting traceback source lines
    ranks: set[str] = field(default_factory=set)
    weak: bool = False  # only seen as a source line inside a traceback so far


@dataclass
class LogScan:
    lines: int = 0
    matches: list[LogMatch] = field(default_factory=list)
    startup: StartupInfo = field(default_factory=StartupInfo)
    mamba_pool_line: int | None = None  # where the state pool's size was logged
    server_args: dict[str, str] = field(default_factory=dict)
    server_args_line: int | None = None
    prefill_batches: int = 0  # prefill log lines that carried new tokens
    cached_tokens: int = 0  # sum of #cached-token over them
    first_prefill_line: int | None = None
    tracebacks: list[Traceback] = field(default_factory=list)
    deaths: list[Death] = field(default_factory=list)  # lines saying a process died (exit code, SIGQUIT...)
    dialect: LogDialect = field(default_factory=LogDialect)


def clean_line(raw: str) -> tuple[str, str, str]:
    """(line without colours, message without the log prefix, rank tag like "TP0" or "")."""
    line = _COMPOSE.sub("", strip_launcher(_ANSI.sub("", raw.rstrip("\r\n"))), count=1)
    m = _PREFIX.match(line)
    if not m:
        other = _OTHER_PREFIX.match(line)
        return (line, line[other.end() :], "") if other and other.end() < len(line) else (line, line, "")
    return line, line[m.end():], m.group("ranks").strip()


def scan_log(raw_lines: Iterable[str]) -> LogScan:
    scan = LogScan()
    seen: dict[str, LogMatch] = {}
    messages: list[str] = []
    rank = ""  # traceback lines carry no prefix: they belong to the rank of the last prefixed line
    in_source = False  # the line after '  File "...", line N' is source code, weaker evidence than the error
    tracebacks = TracebackReader()
    dialect_lines: list[str] = []
    for number, raw in enumerate(raw_lines, start=1):
        scan.lines = number
        line, message, ranks = clean_line(raw)
        prefixed = line is not message
        if prefixed:
            rank = ranks
        tracebacks.feed(number, message, prefixed, rank)
        # One line, one failure: the first (most specific) pattern that matches claims it.
        for pattern in PATTERNS if _ANY_PATTERN.search(message) and not _BENIGN.search(message) else ():
            if pattern.regex.search(message):
                _record(seen, pattern, number, line, rank, weak=in_source)
                break
        in_source = line.lstrip().startswith('File "')
        if len(dialect_lines) < 400 and ("sglang" in message.lower() or "strateg" in message or "version" in message):
            dialect_lines.append(message)
        if any(key in message for key in _STARTUP_KEYS):
            messages.append(message)  # only start-up lines are kept: logs of long runs are large
        if scan.mamba_pool_line is None and "Mamba Cache is allocated" in message:
            scan.mamba_pool_line = number
        _read_prefill(message, number, scan)
        if "server_args" in message or "ServerArgs(" in message:
            scan.server_args.update({k: v.strip("'\"") for k, v in _ARG.findall(message)})
            scan.server_args_line = scan.server_args_line or number
        elif "--" in message and "launch_server" in message or message.lstrip().startswith("--"):
            for name, value in _FLAG.findall(message):
                key = name.replace("-", "_").replace("tp_size", "tp_size")
                scan.server_args.setdefault("tp_size" if key == "tp" else key, value or "True")
            scan.server_args_line = scan.server_args_line or number
    scan.matches = sorted(seen.values(), key=lambda m: m.line)
    scan.tracebacks = tracebacks.finish()
    scan.deaths = tracebacks.deaths
    scan.dialect = read_dialect(dialect_lines)
    scan.startup = parse_startup(messages)
    return scan


def _record(
    seen: dict[str, LogMatch], pattern: LogPattern, number: int, line: str, rank: str, weak: bool
) -> None:
    hit = seen.get(pattern.id)
    if hit is None:
        seen[pattern.id] = hit = LogMatch(pattern, number, line[:_MAX_EVIDENCE], weak=weak)
    elif hit.weak and not weak:
        # The exception line says what happened; the source line before it only shows the check.
        hit.line, hit.evidence, hit.weak = number, line[:_MAX_EVIDENCE], False
    elif not weak:
        hit.count += 1
    if rank:
        hit.ranks.add(rank)


def _read_prefill(message: str, number: int, scan: LogScan) -> None:
    m = _PREFILL.search(message)
    if m and int(m.group(1)) + int(m.group(2)) > 0:
        scan.prefill_batches += 1
        scan.cached_tokens += int(m.group(2))
        if scan.first_prefill_line is None:
            scan.first_prefill_line = number
