"""How every command reports a failure it can name: one `error: …` paragraph on stderr, then its exit code.

Errors go to stderr so that `--json` output on stdout stays parseable whatever happens.
"""

from __future__ import annotations

import typer


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `message` as the command's error and return the Exit to raise (`raise fail(...) from None`)."""
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(code)
