"""Read a server log (SGLang 0.4.x-0.5.x or the bundled runtime) into data: failure-pattern matches, error lines
for the message families, tracebacks, start-up pool sizes, prefix-cache statistics, the model's recurrent state
and the elastic stack in use. Pure text processing; turning it into findings is log_findings.py's job.

The log is read through hybridctl/logs/normalize.py first (wrapped lines, pasted excerpts, prefixes, JSON
logging), so every entry arrives whole; the same failure on several ranks is reported once, at its first line,
with a count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from hybridctl.doctor.log_patterns import PATTERNS, LogPattern
from hybridctl.doctor.log_traceback import Death, Traceback, TracebackReader
from hybridctl.logs.architecture import ModelEvidence
from hybridctl.logs.dialect import LogDialect, read_dialect
from hybridctl.logs.normalize import LogLine, normalize, split_prefix
from hybridctl.logs.startup import StartupInfo, parse_startup

_MAX_EVIDENCE = 400
_MAX_ERRORS = 200
# An elastic-memory stack at work in this server: kvcached's own log lines, torch_memory_saver, SGLang's unified
# memory pool. A start-up crash in the memory pools of such a server is that stack's failure.
_PLUGIN = re.compile(
    r"\[kvcached\]|\bkvcached\b|ENABLE_KVCACHED|KVCACHED_\w+|torch_memory_saver|enable_unified_memory'?\s*[:=]\s*True|--enable-unified-memory\b"
    r"|UNIFIED MEMORY POOL ENABLED",
    re.IGNORECASE,
)
# A line that reports an error (an exception named, an ERROR level, something that failed): the only lines whose
# words the message families read, so a healthy line that merely names a feature is never evidence.
_ERRORISH = re.compile(r"\w(?:Error|Exception)\b|\bERROR\b|\[ERROR\]|\bfailed\b|\bexception\b|^assert", re.I)
# One pass over a healthy line instead of one per pattern: most lines of a long log match nothing.
_ANY_PATTERN = re.compile("|".join(f"(?:{p.regex.pattern})" for p in PATTERNS), re.IGNORECASE)
# Substrings of the lines hybridctl/logs/startup.py parses.
# A line that calls itself harmless (torch_memory_saver: "cuMemCreate CUDA_ERROR_OUT_OF_MEMORY (may not be an
# issue e.g. torch allocator will free cache and retry)") is not evidence of a failure by itself.
_BENIGN = re.compile(r"may not be an issue|can (?:safely )?be ignored|safe to ignore|is harmless", re.IGNORECASE)
_STARTUP_KEYS = ("Cache is allocated", "max_total_num_tokens=", "Tree cache initialized", "fired up and")

_PREFILL = re.compile(r"Prefill batch.*?#new-token: (\d+), #cached-token: (\d+)")
_PREFILL_LINE = "Prefill batch"
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
    model: ModelEvidence = field(default_factory=ModelEvidence)  # does the model carry recurrent state?
    prefills: list[tuple[int, int]] = field(default_factory=list)  # (line, cached tokens) of each prefill
    plugins: dict[str, int] = field(default_factory=dict)  # elastic-memory stack seen active -> first line
    errors: list[tuple[int, str, str]] = field(default_factory=list)  # (line, evidence, message): error lines
    # that no pattern claimed, for the message families (log_families.py)


def clean_line(raw: str) -> tuple[str, str, str]:
    """(line without colours, message without the log prefix, rank tag like "TP0" or "")."""
    line, message, rank, _ = split_prefix(raw)
    return line, message, rank


def scan_log(raw_lines: Iterable[str], patterns: tuple[LogPattern, ...] = PATTERNS) -> LogScan:
    """`patterns`: the message patterns to use (all of them; a test leaves some out to measure the rest)."""
    scan = LogScan()
    seen: dict[str, LogMatch] = {}
    messages: list[str] = []
    rank = ""  # traceback lines carry no prefix: they belong to the rank of the last prefixed line
    in_source = False  # the line after '  File "...", line N' is source code, weaker evidence than the error
    tracebacks = TracebackReader()
    dialect_lines: list[str] = []
    for entry in normalize(raw_lines):
        number, line, message, ranks, prefixed = entry.number, entry.line, entry.message, entry.rank, entry.prefixed
        scan.lines = number
        if prefixed or ranks:
            rank = ranks or rank
        tracebacks.feed(number, message, prefixed, rank)
        claimed = _claims(entry, patterns)
        for pattern in claimed:
            _record(seen, pattern, number, line, rank, weak=in_source)
        if not claimed and not in_source and len(scan.errors) < _MAX_ERRORS and _ERRORISH.search(message):
            scan.errors.append((number, line[:_MAX_EVIDENCE], message))
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
                key = name.replace("-", "_")
                scan.server_args.setdefault("tp_size" if key == "tp" else key, value or "True")
            scan.server_args_line = scan.server_args_line or number
        scan.model.read(message)
        if len(entry.segments) > 1:
            scan.model.read(entry.glued)  # a name a hard wrap split ("Qwen2ForCa" / "usalLM")
        if not message.lstrip().startswith("File ") and (plugin := _PLUGIN.search(message)):
            scan.plugins.setdefault(plugin.group(0).lower().strip("[]-' "), number)
    scan.matches = sorted(seen.values(), key=lambda m: m.line)
    scan.tracebacks = tracebacks.finish()
    scan.deaths = tracebacks.deaths
    scan.dialect = read_dialect(dialect_lines)
    scan.startup = parse_startup(messages)
    return scan


def _first_claim(text: str, patterns: tuple[LogPattern, ...]) -> tuple[LogPattern | None, tuple[int, int]] | None:
    """The first (most specific) pattern that matches, with its span: one message, one failure. A message that
    calls itself harmless claims its text for nothing (pattern None)."""
    if not _ANY_PATTERN.search(text):
        return None
    if benign := _BENIGN.search(text):
        return None, (0, benign.end())
    for pattern in patterns:
        if m := pattern.regex.search(text):
            return pattern, m.span()
    return None


def _claims(entry: LogLine, patterns: tuple[LogPattern, ...]) -> list[LogPattern]:
    """The patterns one entry carries. A wrapped message is matched whole (with a space at each break, then
    glued, for a word the wrap split); a piece outside that match is another message joined to it (a log
    without prefixes), matched on its own."""
    hit = _first_claim(entry.message, patterns)
    if len(entry.segments) <= 1:
        return [hit[0]] if hit and hit[0] else []
    if hit is None and (glued := _first_claim(entry.glued, patterns)) is not None:
        return [glued[0]] if glued[0] else []
    out = [hit[0]] if hit and hit[0] else []
    span = hit[1] if hit else (0, 0)
    offset = 0
    for piece in entry.segments:
        start, offset = offset, offset + len(piece) + 1
        if hit and start < span[1] and offset - 1 > span[0]:
            continue  # part of the message the whole entry matched
        own = _first_claim(piece, patterns)
        if own is not None and own[0] is not None and own[0] not in out:
            out.append(own[0])
    return out


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
    if _PREFILL_LINE not in message:
        return
    for m in _PREFILL.finditer(message):  # a log without prefixes may have joined several
        if int(m.group(1)) + int(m.group(2)) > 0:
            scan.prefill_batches += 1
            scan.cached_tokens += int(m.group(2))
            scan.prefills.append((number, int(m.group(2))))
            if scan.first_prefill_line is None:
                scan.first_prefill_line = number
