"""`hybridctl validate [CONFIG] [SETTINGS]`: every finding about the two files; exit 0 / 1 (--strict) / 2."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from hybridctl.cli.app import app
from hybridctl.cli.config_args import (
    DEFAULT_CONFIG,
    NO_FILES,
    ConfigFiles,
    engine_option,
    json_option,
    takes_config_files,
)
from hybridctl.cli.output import print_json

if TYPE_CHECKING:
    from hybridctl.config.findings import ValidationReport
    from hybridctl.config.schema import HybridConfig

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def render_report(report: ValidationReport) -> None:
    """One line per finding (file:line:col, severity, code, key, message, fix), then a verdict."""
    from rich.console import Console
    from rich.markup import escape

    from hybridshared.units import plural  # not at the top: `hybridctl --help` imports the CLI modules only

    console = Console(highlight=False, soft_wrap=True)
    for f in report.sorted_findings():
        key = f" [bold]{escape(f.key)}[/bold]" if f.key else ""
        severity = f"[{_STYLE[f.severity]}]{f.severity}[/]"
        fix = f" [green]fix:[/] {escape(f.fix)}" if f.fix else ""
        console.print(f"{escape(f.location())}: {severity} {f.code}{key}: {escape(f.message)}{fix}")
    errors, warnings = len(report.errors), len(report.warnings)
    files = escape(f"{report.config_path} + {report.settings_path}")
    if errors:
        console.print(f"[bold red]invalid[/]: {plural(errors, 'error')}, {plural(warnings, 'warning')} in {files}")
    elif warnings:
        console.print(f"[yellow]valid with {plural(warnings, 'warning')}[/]: {files}")
    else:
        console.print(f"[green]valid[/]: {files}")


@app.command("validate")
@takes_config_files()
def validate(
    files: ConfigFiles = NO_FILES,
    engine_version: str | None = typer.Option(
        None,
        "--engine-version",
        "--sglang-version",
        help="SGLang release to check against (default: the installed one, else config.toml's "
        "server.sglang_version, else the newest).",
    ),
    engine: str | None = typer.Option(
        None,
        "--engine",
        help="sglang or builtin: check against this engine (default: server.engine; auto as launch picks here).",
    ),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 when there are warnings."),
    as_json: bool = json_option(),
) -> None:
    """Check config.toml and settings.json: syntax, schema, cross-file and engine rules.

    Exit codes: 0 valid, 1 warnings with --strict, 2 errors.
    """

    from hybridctl.config.loader import settings_path_for
    from hybridctl.launch.plan import auto_engine_here
    from hybridctl.launch.sglang import installed_sglang_version
    from hybridctl.rules.check import check_files

    # Check against the SGLang that would run here unless told otherwise (no sglang: 0.5.23's rules), and
    # engine = "auto" against the engine launch would pick on this host.
    version = engine_version or installed_sglang_version()
    from hybridctl.launch.translate import engine_findings

    engine_option(engine)

    given, settings = files.config, files.settings
    config = given or DEFAULT_CONFIG
    report = check_files(
        config,
        settings_path_for(config, settings),
        engine_version=version,
        engine=engine,
        auto_engine=auto_engine_here(),
        engine_notes=engine_findings,
    )
    judged = _judged_release(engine_version, report.config)  # say which SGLang release was judged
    if as_json:
        print_json({**report.to_dict(), "sglang_release": judged[0], "sglang_release_source": judged[1]})
    else:
        typer.echo(f"judged for SGLang {judged[0]} ({judged[1]})")
        render_report(report)
    raise typer.Exit(report.exit_code(strict=strict))


def _judged_release(requested: str | None, cfg: HybridConfig | None) -> tuple[str, str]:
    """--sglang-version, the installed sglang, config.toml's server.sglang_version, the newest (as the rules)."""
    from hybridshared.flags.engine_flags import DEFAULT_SGLANG_VERSION
    from hybridshared.flags.sglang_version import resolve_release

    configured = cfg.config.server.sglang_version if cfg is not None else None
    return resolve_release(requested, configured, DEFAULT_SGLANG_VERSION)
