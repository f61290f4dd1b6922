"""Python tracebacks and process deaths in a server log, as data: exception type, message, frames, ranks.

Real logs interleave several TP ranks, prefix some lines ("[2026-01-02 10:00:00 TP0] "), wrap others in a
launcher's prefix ("(SGLangHttpServer pid=1) "), abbreviate frames ("... alloc_for_extend -> alloc_req_slots")
and repeat one traceback once per rank. A traceback ends at its exception line ("torch.OutOfMemoryError: CUDA
out of memory. ..."). It reads the entries hybridctl/logs/normalize.py gives back, so a message continued over
several lines arrives as one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# `File "/x/sglang/srt/mem_cache/memory_pool.py", line 499, in _init_mamba_pool`
_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>[\w<>.]+)')
# Abbreviated call chains people paste: "get_next_batch -> alloc_req_slots -> self._alloc_ping_pong_buffer(req)"
_CHAIN = re.compile(r"(?:^|\s)(?:\.\.\.\s*)?(?:->\s*)?[\w.]+(?:\([^)]*\))?(?:\s*->\s*[\w.]+(?:\([^)]*\))?)+")
# "AssertionError: ...", "torch.OutOfMemoryError: ...", "RuntimeError", "KVTransferError(bootstrap_room=1): ..."
_EXC = re.compile(
    r"^(?P<type>(?:[a-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning|Fault|Timeout)\w*)"
    r"(?:\([^)]*\))?(?::\s?(?P<msg>.*))?$"
)
_TRACEBACK_START = "Traceback (most recent call last)"
# A line that starts a new log entry rather than continuing an exception's message.
# A launcher's own prefix before the log text: "(SGLangHttpServer pid=250977) ", "(EngineCore_DP0 pid=1) ".
_LAUNCHER = re.compile(r"^\((?:\w+ )?(?:[\w-]+ )?pid=\d+\)\s*")
# The ways a server process says it died (the scheduler's SIGQUIT, a child's exit code, the kernel's kill).
_DEATH = re.compile(
    r"SIGQUIT received|Received sigquit|Child process unexpectedly failed|exit(?:ed)? (?:with )?(?:exit )?code "
    r"[1-9]\d*|exit status [1-9]\d*|Fatal Python error|Segmentation fault|core dumped|^Killed\b|"
    r"Scheduler hit an exception|Detokenizer hit an exception|TokenizerManager hit an exception|"
    r"DataParallelController hit an exception|process (?:died|crashed)|Aborted \(core dumped\)",
    re.IGNORECASE,
)
# A stop someone asked for (Ctrl-C, a cancelled task at shutdown) is not a crash.
_DELIBERATE = re.compile(r"KeyboardInterrupt|CancelledError|SystemExit|GeneratorExit")
# Lines that show the server still serving after a traceback: that traceback was one request's, not fatal.
_ALIVE = re.compile(r"(?:Prefill|Decode) batch\b|\" 200 OK|HTTP/1\.1\" 200|fired up and ready")


@dataclass
class Frame:
    path: str  # as logged; "" for a name from an abbreviated chain
    func: str
    source: str = ""  # the source line printed under the frame, if any

    @property
    def module(self) -> str:
        """Dotted module from the path's sglang/ (or runtime/, hybridctl/) part; else the file's stem."""
        path = self.path
        if "sglang/srt/" in path:  # a source checkout: /sgl-workspace/sglang/python/sglang/srt/...
            path = path[path.rindex("sglang/srt/") :]
        m = re.search(r"(?:^|/)((?:sglang|runtime|hybridctl|kvcached|torch_memory_saver|nixl|mooncake)/[\w/]+)\.py$",
                      path)  # fmt: skip
        if m:
            return m.group(1).replace("/", ".")
        return re.sub(r"\.py$", "", self.path.rsplit("/", 1)[-1])

    @property
    def in_sglang(self) -> bool:
        return "sglang" in self.path or "runtime/" in self.path or self.path == ""

    def text(self) -> str:
        """What signatures search: module, function and the source line."""
        return f"{self.module} {self.func} {self.source}"


@dataclass
class Traceback:
    start: int  # 1-based line of "Traceback (most recent call last)" (or of the first frame)
    end: int  # line of the exception
    exc_type: str = ""
    message: str = ""
    frames: list[Frame] = field(default_factory=list)
    rank: str = ""
    fatal: bool = False  # the process died of it (no serving after it, or a death line follows)

    @property
    def short_type(self) -> str:
        return self.exc_type.rsplit(".", 1)[-1]

    def innermost_sglang_frame(self) -> Frame | None:
        for frame in reversed(self.frames):
            if frame.in_sglang:
                return frame
        return self.frames[-1] if self.frames else None

    def key(self) -> tuple[str, str]:
        """Identity across ranks: the same exception and message on TP0..TP7 is one failure."""
        return self.short_type, re.sub(r"\d+", "N", self.message)[:200]


@dataclass
class Death:
    line: int
    text: str


def strip_launcher(message: str) -> str:
    return _LAUNCHER.sub("", message)


class TracebackReader:
    """Fed one cleaned message at a time (log prefix already removed); collects tracebacks and deaths."""

    def __init__(self) -> None:
        self.tracebacks: list[Traceback] = []
        self.deaths: list[Death] = []
        self._open: Traceback | None = None
        self._last_frame: Frame | None = None
        self._alive_after: int = 0  # last line that showed the server serving
        self._bare: Traceback | None = None  # the last exception line seen outside any traceback
        self._last_line = 0

    def feed(self, number: int, message: str, prefixed: bool, rank: str) -> None:
        text = strip_launcher(message)
        stripped = text.strip()
        if stripped:
            self._last_line = number
        if _DEATH.search(stripped):
            self.deaths.append(Death(number, stripped[:300]))
        if _ALIVE.search(stripped):
            self._alive_after = number
        if _TRACEBACK_START in stripped:
            self._close()
            self._open = Traceback(start=number, end=number, rank=rank)
            return
        tb = self._open
        if tb is None and (bare := _EXC.match(stripped)) and bare.group("msg") is not None:
            self._bare = Traceback(number, number, bare.group("type"), bare.group("msg").strip(), rank=rank)
        frame = _FRAME.search(stripped)
        if frame and tb is not None and tb.exc_type:
            self._close()  # another rank's traceback, interleaved without its header
            tb = None
        if frame:
            if tb is None:  # a pasted traceback without its header
                tb = self._open = Traceback(start=number, end=number, rank=rank)
            self._last_frame = Frame(frame.group("path"), frame.group("func"))
            tb.frames.append(self._last_frame)
            tb.end = number
            return
        if tb is None:
            return
        if " -> " in stripped and not tb.exc_type and _CHAIN.search(stripped):
            for name in re.split(r"\s*->\s*", stripped.lstrip(". ")):
                func = re.sub(r"\(.*", "", name).rsplit(".", 1)[-1].strip()
                if func:
                    tb.frames.append(Frame("", func))
            tb.end = number
            return
        exc = _EXC.match(stripped)
        if exc and not tb.exc_type:
            tb.exc_type, tb.message, tb.end = exc.group("type"), (exc.group("msg") or "").strip(), number
            self._last_frame = None
            return
        if tb.exc_type:
            # A message continued over several lines arrives joined (hybridctl/logs/normalize.py): whatever comes
            # after the exception line is the next entry.
            if exc is not None:  # a second exception line: another rank's (or a bare one)
                self._close()
                self.feed(number, message, prefixed, rank)
                return
            if stripped.startswith(("During handling", "The above exception")):
                return  # a chained exception follows: the next "Traceback" replaces this one as the last
            self._close()
            return
        if self._last_frame is not None and stripped and not self._last_frame.source and not prefixed:
            self._last_frame.source = stripped[:200]  # the source line under a frame
            tb.end = number
            return
        if prefixed and stripped:
            # A prefixed line with no exception yet: a rank interleaved its own log line; keep waiting.
            return

    def _close(self) -> None:
        if self._open is not None and (self._open.exc_type or self._open.frames):
            self.tracebacks.append(self._open)
        self._open, self._last_frame = None, None

    def finish(self) -> list[Traceback]:
        self._close()
        bare = self._bare
        if bare is not None and bare.end >= self._last_line - 2 and all(t.end < bare.start for t in self.tracebacks):
            self.tracebacks.append(bare)  # a log that ends on an exception line, without its traceback
        for tb in self.tracebacks:
            died = any(d.line >= tb.start - 3 for d in self.deaths)
            tb.fatal = (died or self._alive_after < tb.start) and not _DELIBERATE.search(tb.exc_type)
        return self.tracebacks
