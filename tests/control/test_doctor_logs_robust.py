"""Every corpus log, pasted every way people paste logs, gets the same codes.

Each transformation below is one way a log reaches the doctor other than as the file the server wrote: wrapped
by a terminal or a mail client, quoted in an issue, re-emitted by JSON logging, copied from Windows. The doctor
must read through all of them (hybridctl/logs/normalize.py); the codes it reports must not change.
"""

from __future__ import annotations

import html
import json
import re
import textwrap
from collections.abc import Callable

import pytest

from tests.control.test_doctor_logs_corpus import CORPUS, MANIFEST, codes_of, diagnose_lines

_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d[ T][\d:.,]+(?: [A-Z]{1,4}\d+)*\] ?")
_FRAME = re.compile(r'^(\s*)File "([^"]+)", (line \d+, in \S+)$')


def _soft_wrap(width: int) -> Callable[[list[str]], list[str]]:
    """A mail client or a narrow terminal: long lines broken at spaces, continuation lines unindented."""

    def wrap(lines: list[str]) -> list[str]:
        out = []
        for line in lines:
            indent = line[: len(line) - len(line.lstrip())]
            pieces = textwrap.wrap(line.strip(), width, break_long_words=False, break_on_hyphens=False)
            out += [indent + pieces[0], *pieces[1:]] if len(line) > width and pieces else [line]
        return out

    return wrap


def _hard_wrap(width: int) -> Callable[[list[str]], list[str]]:
    """A terminal's hard wrap: a long log message cut every `width` columns, mid-word."""

    def wrap(lines: list[str]) -> list[str]:
        out = []
        for line in lines:
            if _FRAME.match(line) or line.startswith(" ") or len(line) <= width:
                out.append(line)
                continue
            out += [line[i : i + width] for i in range(0, len(line), width)]
        return out

    return wrap


def _path_own_line(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        m = _FRAME.match(line)
        out += [f'{m.group(1)}File "{m.group(2)}",', f"{m.group(1)}  {m.group(3)}"] if m else [line]
    return out


def _path_alone(lines: list[str]) -> list[str]:
    """`File` / the quoted path / `line N, in f`, each on its own line."""
    out = []
    for line in lines:
        m = _FRAME.match(line)
        out += [f"{m.group(1)}File", f'"{m.group(2)}",', m.group(3)] if m else [line]
    return out


def _no_prefix(lines: list[str]) -> list[str]:
    return [_PREFIX.sub("", line) for line in lines]


def _torch_rank(lines: list[str]) -> list[str]:
    return [f"[rank0]: {line}" for line in lines]


def _ansi(lines: list[str]) -> list[str]:
    return [f"\x1b[1;31m{line}\x1b[0m" if line.strip() else line for line in lines]


def _elide(lines: list[str]) -> list[str]:
    middle = len(lines) // 2
    return ["[...]", *lines[:middle], "...", *lines[middle:], "[... 120 lines omitted ...]"]


def _json_logging(lines: list[str]) -> list[str]:
    """One JSON record per log entry; an entry's unprefixed continuation lines go into its message."""
    records: list[dict[str, str]] = []
    for line in lines:
        m = _PREFIX.match(line)
        if m or not records:
            ranks = re.findall(r"[A-Z]{1,4}\d+", m.group(0)) if m else []
            record = {"time": "2026-01-01T00:00:00Z", "level": "INFO", "message": line[m.end() :] if m else line}
            if ranks:
                record["rank"] = ranks[-1]
            records.append(record)
        else:
            records[-1]["message"] += "\n" + line
    return [json.dumps(r) for r in records]


def _windows(lines: list[str]) -> list[str]:
    def win(m: re.Match[str]) -> str:
        path = "C:" + m.group(2).replace("/", "\\")
        return f'{m.group(1)}File "{path}", {m.group(3)}'

    return [_FRAME.sub(win, line) for line in lines]


def _wsl(lines: list[str]) -> list[str]:
    return [
        _FRAME.sub(lambda m: f'{m.group(1)}File "/mnt/c/Users/me{m.group(2)}", {m.group(3)}', line) for line in lines
    ]


def _markdown_quote(lines: list[str]) -> list[str]:
    return [f"> {line}" for line in lines]


def _fenced(lines: list[str]) -> list[str]:
    return ["Here is the log:", "", "```text", *lines, "```", "", "Any idea?"]


def _carets(lines: list[str]) -> list[str]:
    """Python 3.11+: a line of carets under each frame's source line."""
    out = []
    for before, line in zip(["", *lines], lines, strict=False):
        out.append(line)
        if before.lstrip().startswith('File "') and line.startswith("    ") and not line.lstrip().startswith("File"):
            out.append("    " + "^" * max(4, len(line.strip()) // 2))
    return out


def _k8s(lines: list[str]) -> list[str]:
    """kubectl logs --timestamps: the collector's stamp on every line, traceback lines included."""
    return [f"2026-03-02T11:21:{i % 60:02d}.123456789Z {line}" for i, line in enumerate(lines)]


TRANSFORMS: dict[str, Callable[[list[str]], list[str]]] = {
    "soft_wrap_60": _soft_wrap(60),
    "soft_wrap_88": _soft_wrap(88),
    "soft_wrap_120": _soft_wrap(120),
    "hard_wrap_100": _hard_wrap(100),
    "path_own_line": _path_own_line,
    "path_alone": _path_alone,
    "no_timestamps": _no_prefix,
    "torch_rank_prefix": _torch_rank,
    "ansi": _ansi,
    "elisions": _elide,
    "json_logging": _json_logging,
    "windows_paths": _windows,
    "wsl_paths": _wsl,
    "markdown_quote": _markdown_quote,
    "code_fence": _fenced,
    "crlf": lambda lines: [f"{line}\r" for line in lines],
    "indented_code_block": lambda lines: [f"    {line}" for line in lines],
    "python311_carets": _carets,
    "kubernetes_timestamps": _k8s,
    "html_escaped": lambda lines: [html.escape(line) for line in lines],
    "ray_actor_prefix": lambda lines: [f"(SGLangEngine pid=4242, ip=10.0.0.7) {line}" for line in lines],
    "quoted_fenced_wrapped": lambda lines: _markdown_quote(_fenced(_soft_wrap(72)(_no_prefix(lines)))),
}

_ORIGINAL = {name: (CORPUS / f"{name}.log").read_text(encoding="utf-8").splitlines() for name in MANIFEST}


@pytest.mark.parametrize("transform", sorted(TRANSFORMS))
def test_every_corpus_log_keeps_its_codes_under(transform: str) -> None:
    changed = {}
    for name, lines in _ORIGINAL.items():
        before = codes_of(diagnose_lines(lines))
        after = codes_of(diagnose_lines(TRANSFORMS[transform](lines)))
        if after != before:
            changed[name] = (before, after)
    assert changed == {}


def test_the_transformations_really_change_the_text() -> None:
    """A transformation that leaves every log as it was would make its test pass by doing nothing."""
    for transform, fn in TRANSFORMS.items():
        assert sum(fn(lines) != lines for lines in _ORIGINAL.values()) >= 10, transform
