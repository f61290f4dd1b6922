"""Command-line entry point. Each command lives in its own module and registers on `app`.

Command modules import heavy libraries (rich tables, httpx, the planner) inside their functions so that
`hybridctl --help` stays fast; none of them may import torch.
"""

from __future__ import annotations

import io
import os
import sys

from hybridctl.cli import (  # noqa: F401  (imported for their @app.command registrations)
    bench_cmd,
    demo_cmd,
    doctor_cmd,
    init_cmd,
    launch_cmd,
    plan_cmd,
    schema_cmd,
    validate_cmd,
    verify_cmd,
)
from hybridctl.cli.app import app

# Set to any non-empty value to see the Python traceback of an unexpected failure instead of the one-line error.
DEBUG_ENV = "HYBRIDCTL_DEBUG"
# What an unexpected failure exits with: 2, the code every command documents for "could not do what was asked".
CRASH_EXIT = 2


def main() -> None:
    """Run the CLI. The commands report the failures they know as `error: …` lines; anything else that escapes
    is a hybridctl bug, and the user sees one line saying what failed and how to report it, not a traceback."""
    for stream in (sys.stdout, sys.stderr):
        # A terminal or pipe whose encoding lacks a character we print (✓, —, a path's odd bytes) gets a "?"
        # in its place rather than a UnicodeEncodeError: PYTHONIOENCODING=ascii, a latin-1 locale.
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="replace")
    try:
        app()
    except BrokenPipeError:
        # stdout's reader went away (`hybridctl schema | head`): nothing left to tell it. Point stdout at
        # /dev/null so the interpreter's final flush does not raise a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(141) from None  # 128 + SIGPIPE, what a shell reports for a command killed by the pipe
    except Exception as exc:
        if os.environ.get(DEBUG_ENV):
            raise
        raise SystemExit(_report_crash(exc)) from None


def _report_crash(exc: Exception) -> int:
    command = " ".join(["hybridctl", *sys.argv[1:2]])
    detail = str(exc).replace("\n", " ")
    if len(detail) > 300:  # a 4 KB path in an OSError says nothing more than its first part
        detail = detail[:300] + "…"
    sys.stderr.write(
        f"error: {command} failed unexpectedly: {type(exc).__name__}: {detail}\n"
        f"This is a bug in hybridctl; please report it with the command line. {DEBUG_ENV}=1 shows the traceback.\n"
    )
    return CRASH_EXIT


__all__ = ["app", "main"]
