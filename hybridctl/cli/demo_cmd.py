"""`hybridctl demo`: build a tiny model, serve it with the bundled runtime, verify, bench, report, stop.

Exit codes: 0 every step passed, 1 a check or request failed, 2 the demo could not run (files exist without
--force, the runtime extra is missing, the server did not start).
"""

from __future__ import annotations

from pathlib import Path

import typer

from hybridctl.cli.app import app
from hybridctl.cli.config_args import json_option
from hybridctl.cli.output import fail, print_json


@app.command("demo")
def demo(
    out: Path = typer.Option(Path("hybridctl-demo"), "--dir", "--out", help="Directory for the demo's files."),
    force: bool = typer.Option(False, "--force", help="Overwrite the files of an earlier demo in that directory."),
    port: int | None = typer.Option(
        None, "--port", min=1, max=65535, help="Server port (default: 30000 if free, else any)."
    ),
    as_json: bool = json_option(),
) -> None:
    """The first command to run: init --demo, launch, verify all, a short bench, report.json, stop."""
    from rich.console import Console
    from rich.markup import escape

    from hybridctl.demo.flow import DemoError, DemoOptions, run_demo
    from hybridctl.demo.render import render_demo

    err = Console(stderr=True)
    opts = DemoOptions(out_dir=out, force=force, port=port)
    try:
        with err.status("demo …") as status:
            report = run_demo(opts, progress=lambda msg: status.update(escape(msg)))
    except DemoError as exc:
        partial = getattr(exc, "report", None)
        if partial is not None and not as_json:
            render_demo(partial, Console())
        if as_json and partial is not None:
            print_json({**partial.to_dict(), "error": str(exc)})
        raise fail(str(exc)) from None
    if as_json:
        print_json(report.to_dict())
    else:
        render_demo(report, Console())
    raise typer.Exit(0 if report.passed else 1)
