"""Server logs the way people paste them -> one logical line per log entry, before anything is matched.

A log reaches the doctor as a file, but just as often as an excerpt quoted in an issue: Markdown quoting (`> `),
code fences, `[...]` where lines were cut, messages broken at 60-120 columns (a terminal's hard wrap splits a
word, a mail client's soft wrap does not), a traceback's file path on a line of its own and `line 499, in f` on
the next, Windows or WSL paths, JSON-formatted logging, timestamps and rank prefixes present or absent. Matching
line by line fails on all of these, so this module undoes them first and gives each entry back whole:

- `LogLine.message` is the entry without its log prefix, its wrapped continuation lines joined with a space;
  `LogLine.glued` joins the same pieces with nothing between them (a word split by a hard wrap), for matching.
- `LogLine.segments` are the physical pieces, so a matcher can tell one message wrapped over three lines from
  two messages that happened to be joined.
- `LogLine.number` is the 1-based physical line the entry starts on: findings point into the file as given.

The log-prefix grammar (SGLang's `[ts TP0]`, launcher, docker compose, Python logging, torch's `[rank0]:`) lives
here too, since deciding what continues what needs to know which lines start an entry.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# SGLang's configure_logger: "[%(asctime)s{.ms}{ prefix}] message", prefix like " TP0" or " DP1 TP3".
_PREFIX = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)(?P<ranks>(?: [A-Z]{1,4}\d+)*)\]\s?")
# Other prefixes pasted logs carry: vLLM-style ("ERROR 11-13 11:03:06 [core.py:708] "), Python logging
# ("2026-03-02 11:21:07,512 - ERROR - ", "2026-03-02 11:21:07 ERROR "), a bare rank tag ("[TP0] ").
_OTHER_PREFIX = re.compile(
    r"^(?:(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\]\s?"
    r"|\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?Z?\s*(?:-\s*)?(?:[\w.]+\s+-\s+)?"
    r"(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\s*[-:]?\s"
    r"|\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)? \| *(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) *\| (?:[\w.:<>]+ - )?"
    r"|\[(?P<ranks>(?:[A-Z]{1,4}\d+ ?)+)\]\s)"
)
# Prefixes that say which process wrote a line but do not start a new entry: a traceback printed through them
# still continues. docker compose ("sglang-1  | "), a launcher ("(SGLangHttpServer pid=1) "), torch's "[rank0]: ".
_COMPOSE = re.compile(r"^[\w.-]+\s+\|\s?")
_LAUNCHER = re.compile(r"^\((?:[\w.-]+ )*pid=\d+(?:, ip=[\d.:a-f]+)?\)\s*")
# A collector's own stamp on every line, traceback lines included: Kubernetes / CloudWatch (RFC 3339), journald.
_COLLECTOR = re.compile(
    r"^(?:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)\s+(?:stdout|stderr)?\s*(?:[FP]\s)?"
    r"|[A-Z][a-z]{2} +\d+ \d\d:\d\d:\d\d \S+ [\w.@/-]+(?:\[\d+\])?: )"
)
_TORCH_RANK = re.compile(r"^\[(?P<rank>rank\d+)\]:\s?")

_ENTITY = re.compile(r"&(?:quot|gt|lt|amp|#39|#x27|apos);")
_QUOTE = re.compile(r"^\s{0,3}(?:>\s?)+")
_FENCE = re.compile(r"^\s*(?:```|~~~)")
_HTML = re.compile(r"</?(?:details|summary|pre|code|br)\b[^>]*>", re.IGNORECASE)
# A line that only says something was cut: "[...]", "...", "(...)", "<snip>", "[... 40 lines omitted ...]".
_ELISION = re.compile(
    r"\s*(?:\[\s*(?:\.\.\.|…|snip|truncated|omitted)[^\]]*\]|\(\s*(?:\.\.\.|…)[^)]*\)|\.{3,}|…|<snip>"
    r"|\.\.\.\s*\(?\d+ (?:more )?lines?[^)]*\)?)\s*"
)
# Python 3.11+ underlines the failing expression under a frame's source line: no information.
_CARETS = re.compile(r"\s*[\^~]+\s*")
_WIN_PATH = re.compile(r"(?:[A-Za-z]:|\\\\[\w.$-]+)?(?:\\+[\w.$~ ()-]+)+\.pyc?\b")
# `File "/x/sglang/srt/mem_cache/memory_pool.py", line 499, in _init_mamba_pool` in any of its broken forms.
FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>[\w<>.]+)')
_LOOSE_FRAME = re.compile(
    r'(?:File\s*|^\s*(?="?[^"\s,]+\.py))"?(?P<path>[^"\s,]+?)"?\s*,?\s*line\s+(?P<line>\d+)\s*,?\s*in\s+(?P<func>[\w<>.]+)'
)
_PATH_ONLY = re.compile(r'\s*(?:File\s*)?"?[^\s"]*\.py"?,?\s*')
_LINE_IN = re.compile(r"\s*,?\s*line \d+,\s*in [\w<>.]+")
EXCEPTION = re.compile(
    r"^(?P<type>(?:[a-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning|Fault|Timeout)\w*)"
    r"(?:\([^)]*\))?(?::\s?(?P<msg>.*))?$"
)
# A line that starts an entry of its own even without a log prefix.
_ENTRY = re.compile(
    r"(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\b|\[|#\s|\$\s|Traceback \(most|File\b|During handling|The above exception"
    r"|line \d+, in\b|(?:\.\.\.\s*)?->|(?:\.\.\.\s*)?[\w.]+(?:\([^)]*\))?\s*->|[^:]{1,40}: (?:error|warning|fatal)\b",
    re.IGNORECASE,
)
_REPORTS = re.compile(r"\b(?:failed|failure|exception|error|warning|received|exit(?:ed)?|killed)\b", re.IGNORECASE)
# A wrap never happens in a short line: below this many characters the next line is a new entry.
_WRAP_MIN = 50
_JSON_MESSAGE = ("message", "msg", "text", "event", "log")
_JSON_EXTRA = ("exc_info", "exception", "exc_text", "exc", "error", "stack_trace", "stacktrace", "traceback", "stack")
_JSON_RANK = ("rank", "tp_rank")


@dataclass
class LogLine:
    number: int  # 1-based physical line the entry starts on
    line: str  # the entry as logged (prefix kept, colours and quoting removed), continuations joined
    message: str  # without the log prefix, continuations joined with a space
    rank: str = ""  # "TP0", "DP1 TP3", "rank0" or ""
    prefixed: bool = False  # began with a log prefix (a new entry for certain)
    segments: list[str] = field(default_factory=list)  # the physical pieces of `message` (joined by one space)

    @property
    def glued(self) -> str:
        """The pieces joined with nothing between them: a word a hard wrap split is whole again."""
        return "".join(self.segments)


@dataclass
class _Piece:
    text: str
    prefixed: bool | None = None  # None: read it from the text's own prefix
    rank: str = ""


def split_prefix(raw: str) -> tuple[str, str, str, bool]:
    """(line without colours and launcher, message without the log prefix, rank tag, prefixed)."""
    line = _COLLECTOR.sub("", ANSI.sub("", raw.rstrip("\r\n")), count=1)
    line = _COMPOSE.sub("", _LAUNCHER.sub("", line), count=1)
    line = _LAUNCHER.sub("", line)
    rank = ""
    while m := _TORCH_RANK.match(line):
        line, rank = line[m.end() :], m.group("rank")
    m = _PREFIX.match(line)
    if m:
        return line, line[m.end() :], m.group("ranks").strip() or rank, True
    other = _OTHER_PREFIX.match(line)
    if other and other.end() < len(line):
        return line, line[other.end() :], (other.group("ranks") or "").strip() or rank, True
    return line, line, rank, False


def _pieces(raw: str) -> list[_Piece]:
    """One physical line -> the lines it stands for (none for fences and elisions, several for a JSON record)."""
    text = ANSI.sub("", raw.rstrip("\r\n"))
    if "&" in text and _ENTITY.search(text):
        text = html.unescape(text)  # copied from a rendered page: &quot;, &gt;, &#39;
    text = _QUOTE.sub("", text)
    if _FENCE.match(text):
        return []
    text = _HTML.sub("", text)
    if _ELISION.fullmatch(text) or _CARETS.fullmatch(text):
        return []
    stripped = text.strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        record = _json(stripped)
        if record is not None:
            return record
    if "\\" in text and ".py" in text:
        text = _WIN_PATH.sub(lambda m: m.group(0).replace("\\\\", "/").replace("\\", "/"), text)
    return [_Piece(text)]


def _json(text: str) -> list[_Piece] | None:
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    message = next((record[k] for k in _JSON_MESSAGE if isinstance(record.get(k), str)), None)
    if message is None:
        return None
    rank = next((str(record[k]) for k in _JSON_RANK if record.get(k) is not None), "")
    rank = f"TP{rank}" if rank.isdigit() else rank
    # A docker json-file record ({"log": ...}) carries the original line, prefix and all.
    docker = "log" in record and "message" not in record and "msg" not in record
    lines = message.rstrip("\n").split("\n")
    for key in _JSON_EXTRA:
        extra = record.get(key)
        if isinstance(extra, str) and extra.strip():
            lines += extra.rstrip("\n").split("\n")
    pieces = [_Piece(line, None if docker else i == 0, "" if docker else rank) for i, line in enumerate(lines)]
    return [p for p in pieces if not _ELISION.fullmatch(p.text)]


def _frame_fix(text: str) -> str:
    """A frame put back together from its pieces, in the form Python prints it."""
    m = _LOOSE_FRAME.search(text)
    if m is None:
        return text
    indent = text[: len(text) - len(text.lstrip())]
    return f'{indent}File "{m.group("path")}", line {m.group("line")}, in {m.group("func")}'


def _open_frame(text: str) -> bool:
    """A frame line still waiting for its `line N, in f` (the path was wrapped)."""
    s = text.strip()
    if FRAME.search(s) or _LOOSE_FRAME.search(s):
        return False
    return s.startswith("File") or bool(_PATH_ONLY.fullmatch(s) and s.rstrip(",").rstrip('"').endswith(".py"))


def _starts_entry(text: str) -> bool:
    s = text.lstrip()
    return bool(_ENTRY.match(s) or EXCEPTION.match(s))


def _continues(pieces: list[str], nxt: str) -> bool:
    """Does `nxt` (an unprefixed line) continue the message whose physical pieces so far are `pieces`?"""
    prev = pieces[-1].rstrip()
    # Only a long line was wrapped; a short last piece still continues a message already wrapped once (a
    # paste wrapped twice, by the terminal and then by the mail client, leaves short pieces mid-message).
    if len(prev) < _WRAP_MIN and (len(pieces) < 2 or len(pieces[0]) < _WRAP_MIN):
        return False
    if not prev.endswith((".", "!", "?")):
        return True
    first = nxt.lstrip()[:1]
    return first.islower() or first.isdigit() or first in "-'\"(,;:"


def _dedented(raw_lines: Iterable[str]) -> list[tuple[int, _Piece]]:
    """Every piece with its line number; an excerpt indented as a whole (a Markdown code block, a quote) loses
    the indentation all its lines share, so its log prefixes start the line again."""
    pieces = [(number, piece) for number, raw in enumerate(raw_lines, start=1) for piece in _pieces(raw)]
    texts = [p.text for _, p in pieces if p.text.strip()]
    indent = min((len(t) - len(t.lstrip(" \t")) for t in texts), default=0)
    if indent:
        pieces = [(n, _Piece(p.text[indent:], p.prefixed, p.rank)) for n, p in pieces]
    return pieces


def _continues_exception(message: str, nxt: str) -> bool:
    """An exception's message goes on over the next lines ("CUDA out of memory." / "Tried to allocate 18.56 GiB.")
    unless, after a finished sentence, the next line reports something of its own (a log line stripped of its
    prefix: "Prefill transfer failed for request ...")."""
    return not (message.rstrip().endswith((".", "!", "?")) and _REPORTS.search(nxt))


def normalize(raw_lines: Iterable[str]) -> Iterator[LogLine]:
    cur: LogLine | None = None
    kind = ""  # what cur is: "exc" (an exception line), "frame" (a complete frame), "text", "source", "open"
    for number, piece in _dedented(raw_lines):
        line, message, rank, prefixed = split_prefix(piece.text)
        if piece.prefixed is not None:
            prefixed, rank = piece.prefixed, piece.rank or rank
        if _CARETS.fullmatch(message):
            continue
        if not message.strip():
            if cur is not None:
                yield cur
            cur, kind = None, ""
            continue
        stripped = message.strip()
        if cur is not None and kind == "open" and not prefixed:
            glue = "" if cur.message.count('"') % 2 else " "
            cur.message = _frame_fix(cur.message + glue + stripped)
            cur.line = cur.message
            cur.segments.append(stripped)
            kind = "open" if _open_frame(cur.message) else "frame"
            continue
        if cur is not None and not prefixed and kind not in ("frame", "source") and not _starts_entry(message):
            if (kind == "exc" and _continues_exception(cur.message, stripped)) or (
                kind == "text" and (cur.prefixed or _continues(cur.segments, message))
            ):
                cur.message = f"{cur.message} {stripped}"
                cur.line = f"{cur.line} {stripped}"
                cur.segments.append(stripped)
                continue
        if cur is not None:
            yield cur
        if kind in ("frame",) and not prefixed and not _starts_entry(message):
            cur, kind = LogLine(number, line, message, rank, prefixed, [message]), "source"
            continue
        if _open_frame(message):
            text = message if stripped.startswith("File") else f"  File {stripped}"
            cur, kind = LogLine(number, text, text, rank, prefixed, [stripped]), "open"
            continue
        if FRAME.search(message) or _LOOSE_FRAME.search(message):
            fixed = _frame_fix(message)
            cur, kind = LogLine(number, fixed if not prefixed else line, fixed, rank, prefixed, [fixed]), "frame"
            continue
        cur = LogLine(number, line, message, rank, prefixed, [message])
        kind = "exc" if EXCEPTION.match(stripped) else "text"
    if cur is not None:
        yield cur
