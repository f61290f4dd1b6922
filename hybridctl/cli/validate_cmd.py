"""`hybridctl validate [CONFIG] [SETTINGS]`: every finding about the two files; exit 0 / 1 (--strict) / 2."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from hybridctl.cli.app import app
from hybridctl.cli.output import print_json

if TYPE_CHECKING:
    from hybridctl.config.findings import ValidationReport

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def render_report(report: ValidationReport) -> None:
    """One line per finding (file:line:col, severity, code, key, message, fix), then a verdict."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(highlight=False, soft_wrap=True)
    for f in report.sorted_findings():
        key = f" [bold]{escape(f.key)}[/bold]" if f.key else ""
        severity = f"[{_STYLE[f.severity]}]{f.severity}[/]"
        fix = f" [green]fix:[/] {escape(f.fix)}" if f.fix else ""
        console.print(f"{escape(f.location())}: {severity} {f.code}{key}: {escape(f.message)}{fix}")
    errors, warnings = len(report.errors), len(report.warnings)
    files = escape(f"{report.config_path} + {report.settings_path}")
    if errors:
        console.print(f"[bold red]invalid[/]: {errors} error(s), {warnings} warning(s) in {files}")
    elif warnings:
        console.print(f"[yellow]valid with {warnings} warning(s)[/]: {files}")
    else:
        console.print(f"[green]valid[/]: {files}")


@app.command("validate")
def validate(
    config: Path = typer.Argument(Path("config.toml"), help="config.toml to check."),
    settings: Path | None = typer.Argument(
        None, help="settings.json to check (optional file; default: the one beside config.toml)."
    ),
    engine_version: str | None = typer.Option(
        None,
        "--engine-version",
        help="SGLang version to check against (default: the installed one, else 0.5.23).",
    ),
    engine: str | None = typer.Option(
        None,
        "--engine",
        help="sglang or builtin: check against this engine (default: server.engine; auto as launch picks here).",
    ),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 when there are warnings."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Check config.toml and settings.json: syntax, schema, cross-file and engine rules.

    Exit codes: 0 valid, 1 warnings with --strict, 2 errors.
    """

    from hybridctl.config.loader import check_files, settings_path_for
    from hybridctl.launch.engine_select import auto_engine_here
    from hybridctl.launch.version import installed_sglang_version

    # Check against the SGLang that would run here unless told otherwise (no sglang: 0.5.23's rules), and
    # engine = "auto" against the engine launch would pick on this host.
    version = engine_version or installed_sglang_version()
    from hybridctl.cli.output import fail
    from hybridctl.launch.engine_findings import engine_findings
    from hybridctl.launch.engine_select import ENGINE_NAMES

    if engine is not None and engine not in ENGINE_NAMES:
        raise fail(f"--engine {engine}: use {', '.join(ENGINE_NAMES)}")

    report = check_files(
        config,
        settings_path_for(config, settings),
        engine_version=version,
        engine=engine,
        auto_engine=auto_engine_here(),
        engine_notes=engine_findings,
    )
    if as_json:
        print_json(report.to_dict())
    else:
        render_report(report)
    raise typer.Exit(report.exit_code(strict=strict))
