"""The typer application object; command modules register themselves on it."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="hybridctl",
    help="Configure, plan, launch and verify hybrid (attention + linear/Mamba) model serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help texts are plain text: Rich markup would eat every "[...]" in them ("[server] engine", "[len*ratio, len]").
    rich_markup_mode=None,
)
