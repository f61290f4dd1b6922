"""How every command writes its result and its failures.

Results given with `--json` go to stdout as one indented JSON document; a failure the command can name is one
`error: …` paragraph on stderr, so that stdout stays parseable whatever happens.
"""

from __future__ import annotations

import json

import typer


def print_json(data: object) -> None:
    """`data` as the command's JSON output."""
    typer.echo(json.dumps(data, indent=2))


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `message` as the command's error and return the Exit to raise (`raise fail(...) from None`)."""
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(code)
