"""`hybridctl doctor`: host checks, failure predictions from the config, log diagnosis, --fix.

Exit codes: 0 clean, 1 warnings, 2 errors (also for unusable arguments: a missing log or config file).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from hybridctl.cli.app import app
from hybridctl.cli.config_args import (
    DEFAULT_CONFIG,
    MAX_MEMORY_GIB,
    NO_FILES,
    ConfigFiles,
    json_option,
    takes_config_files,
)
from hybridctl.cli.output import fail, print_json

if TYPE_CHECKING:
    from collections.abc import Iterable
    from contextlib import ExitStack

    from rich.console import Console

    from hybridctl.doctor.fix import FileEdit
    from hybridctl.doctor.report import DoctorReport

_MARK = {
    "ok": "[green]\\[✓][/]",
    "warning": "[yellow]\\[!][/]",
    "error": "[red]\\[✗][/]",
    "skipped": "[dim]\\[-][/]",
}
_SEVERITY = {"error": "[red]✗ error[/]", "warning": "[yellow]! warning[/]", "info": "[cyan]• info[/]"}


def render(report: DoctorReport, console: Console, verbose: bool) -> None:
    from rich.markup import escape

    console.print("Doctor summary" + ("" if verbose else " (to see all details, run hybridctl doctor -v)") + ":")
    for c in report.checks:
        console.print(f"{_MARK[c.status]} [bold]{escape(c.name)}[/]  {escape(c.summary)}")
        if verbose:
            for d in c.details:
                console.print(f"    • {escape(d)}")
    for ignored in report.ignored:
        console.print(f"{_MARK['skipped']} [bold]{escape(ignored.option)}[/]  ignored: {escape(ignored.reason)}")
    findings = report.sorted_findings()
    if findings:
        console.print()
    for f in findings:
        origin = f.changes[0].file if f.source == "config" and f.changes else f.source
        where = f" ({origin}{f' line {f.line}' if f.line else ''})"
        console.print(f"{_SEVERITY[f.severity]} [bold]{f.code}[/]{escape(where)}")
        if f.evidence:
            console.print(f"    evidence: {escape(f.evidence)}")
        if verbose and f.basis:
            console.print(f"    basis: {escape('; '.join(f.basis))}")
        console.print(f"    cause: {escape(f.cause)}")
        console.print(f"    [green]fix:[/] {escape(f.fix)}")
    console.print()
    style = "red" if report.errors else "yellow" if report.warnings else "green"
    console.print(f"[{style}]{escape(report.summary())}[/]")


def _apply_fixes(report: DoctorReport, config: Path, settings: Path, yes: bool, console: Console) -> list[FileEdit]:
    import sys

    from rich.markup import escape

    from hybridctl.doctor.fix import FixError, collect_changes, plan_edits, write_edits

    changes = collect_changes(report.sorted_findings())
    try:
        edits = plan_edits(changes, config, settings)
    except FixError as exc:
        raise fail(str(exc)) from None
    if not edits:
        console.print("--fix: nothing to change in the config files.")
        return []
    for edit in edits:
        console.print(escape(edit.diff()), end="")
    if not yes:
        if not sys.stdin.isatty():
            raise fail("--fix needs a confirmation and stdin is not a terminal; pass --yes to write the changes.")
        if not typer.confirm("Write these changes?", default=False):
            console.print("Nothing written.")
            return []
    try:
        write_edits(edits)
    except OSError as exc:  # WriteFailed: says which file and why
        raise fail(str(exc)) from None
    console.print(f"Wrote {', '.join(str(e.path) for e in edits)}. Run hybridctl doctor again to re-check.")
    return edits


@app.command("doctor")
@takes_config_files()
def doctor(
    files: ConfigFiles = NO_FILES,
    log: str | None = typer.Option(None, "--log", "-l", help="Server log to diagnose; - reads stdin."),
    url: str | None = typer.Option(
        None, "--url", help="A running server (http://HOST:PORT) to judge from /server_info and /metrics."
    ),
    api_key_env: str | None = typer.Option(
        None, "--api-key-env", help="With --url: the environment variable holding the server's API key."
    ),
    peer: Path | None = typer.Option(
        None, "--peer", help="The other PD server's config.toml: compare recurrent-state shapes and dtypes."
    ),
    gpu_mem_gib: float | None = typer.Option(
        None, "--gpu-mem-gib", min=0.001, max=MAX_MEMORY_GIB, help="GPU memory to plan for (default: the first GPU's)."
    ),
    fix: bool = typer.Option(False, "--fix", help="Write the suggested changes into config.toml / settings.json."),
    yes: bool = typer.Option(False, "--yes", "-y", help="With --fix: do not ask for confirmation."),
    probe: bool = typer.Option(
        True, "--host/--no-host", help="Probe this machine (driver, GPUs, torch, sglang); --no-host skips it."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show every check's details."),
    as_json: bool = json_option(),
) -> None:
    """Check the host, predict hybrid-serving failures from the config, diagnose a server log.

    Exit codes: 0 clean, 1 warnings, 2 errors.
    """
    from contextlib import ExitStack

    from rich.console import Console

    from hybridctl.config.loader import settings_path_for
    from hybridctl.doctor.run import DoctorOptions, run_doctor, unprobed_host
    from hybridshared import paths
    from hybridshared.units import GIB

    given, settings = files.config, files.settings
    config = given or DEFAULT_CONFIG
    config_given = given is not None or settings is not None or fix
    settings_path = settings_path_for(config, settings)
    if fix and not paths.exists(config):
        raise fail(f"--fix edits {config}, which does not exist; pass --config PATH.")
    if peer is not None and not paths.exists(peer):
        raise fail(f"--peer {peer}: no such file; pass the other server's config.toml.")
    console = Console(highlight=False, soft_wrap=True, stderr=as_json)
    with ExitStack() as stack:
        lines = _open_log(stack, log)
        options = DoctorOptions(
            config_path=config,
            settings_path=settings_path,
            config_given=config_given,
            log_lines=lines,
            log_name="stdin" if log == "-" else str(log),
            peer_config=peer,
            gpu_mem_bytes=int(gpu_mem_gib * GIB) if gpu_mem_gib else None,
            url=url,
            api_key_env=api_key_env,
        )
        report = run_doctor(options, None if probe else unprobed_host())
    if yes and not fix:
        from hybridctl.doctor.report import IgnoredOption

        report.ignored.append(IgnoredOption("--yes", "only --fix asks for a confirmation"))
    if as_json:
        _print_json_report(report, config, settings_path, fix, yes, console)
    else:
        render(report, console, verbose)
        if fix:
            _apply_fixes(report, config, settings_path, yes, console)
    raise typer.Exit(report.exit_code())


def _open_log(stack: ExitStack, log: str | None) -> Iterable[str] | None:
    """--log's lines: stdin for -, else the file (closed with `stack`); None without --log."""
    import sys

    if log == "-":
        return sys.stdin
    if log is None:
        return None
    try:
        return stack.enter_context(open(log, encoding="utf-8", errors="replace"))
    except OSError as exc:
        raise fail(f"--log {log}: cannot read it ({exc.strerror}).") from None


def _print_json_report(
    report: DoctorReport, config: Path, settings_path: Path, fix: bool, yes: bool, console: Console
) -> None:
    """The report as JSON; with --fix (which needs --yes here) the edits made, as diffs."""
    if fix and not yes:
        raise fail("--fix with --json cannot ask for confirmation; add --yes.")
    edits = _apply_fixes(report, config, settings_path, yes, console) if fix else []
    out = report.to_dict()
    if fix:
        out["fixed"] = [{"path": str(e.path), "diff": e.diff()} for e in edits]
    print_json(out)
