"""`hybridctl schema`: JSON Schemas of config.toml and settings.json (for editors), or the key reference."""

from __future__ import annotations

from pathlib import Path

import typer

from hybridctl.cli.app import app
from hybridctl.cli.output import fail, print_json


@app.command("schema")
def schema(
    out: Path | None = typer.Option(
        None, "--out", help="Write config.schema.json and settings.schema.json into this directory."
    ),
    file: str | None = typer.Option(None, "--file", help="Print only one schema: config or settings."),
    docs: bool = typer.Option(False, "--docs", help="Print the Markdown reference of every key instead."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing schema files under --out."),
) -> None:
    """Print (or write with --out) the JSON Schemas generated from hybridctl's config schema."""
    import json

    from hybridctl.config.schema import SCHEMA_FILE_NAMES, json_schema

    if docs:
        from hybridctl.config.docs_table import render_configuration_md

        typer.echo(render_configuration_md(), nl=False)
        return
    if file is not None and file not in SCHEMA_FILE_NAMES:
        raise fail(f"--file {file}: expected one of {', '.join(SCHEMA_FILE_NAMES)}.")
    which = [file] if file else list(SCHEMA_FILE_NAMES)
    texts = {w: json.dumps(json_schema(w), indent=2) + "\n" for w in which}
    if out is None:
        if len(texts) == 1:
            typer.echo(next(iter(texts.values())), nl=False)
        else:
            print_json({SCHEMA_FILE_NAMES[w]: json.loads(t) for w, t in texts.items()})
        return
    from hybridctl.config.atomic_write import WouldOverwriteError, WriteFailed, write_files

    try:
        written = write_files({out / SCHEMA_FILE_NAMES[w]: t for w, t in texts.items()}, force=force)
    except (WouldOverwriteError, WriteFailed) as exc:
        raise fail(str(exc)) from None
    for path in written:
        typer.echo(f"wrote {path}")
