"""`hybridctl launch`, `status`, `stop`: serve a config with SGLang or the bundled runtime.

Exit codes: launch 0 served (or dry run), 1 the server failed to start or exited on its own, 2 the config cannot be
launched as asked, 143/130/129 stopped by SIGTERM/SIGINT/SIGHUP (forwarded to the server, which was waited for);
status 0 running and healthy, 1 running but /health fails, 2 corrupt state file or no such config file, 3 not running
(stale state file too); stop 0 (stopped, or nothing to stop), 2 corrupt or stale state file (nothing signalled, the
file kept) or no such config file.
"""

from __future__ import annotations

import shlex
import signal
from pathlib import Path
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
from hybridctl.cli.output import fail, print_json

if TYPE_CHECKING:
    from rich.console import Console

    from hybridctl.config.schema import HybridConfig
    from hybridctl.launch.plan import LaunchPlan
    from hybridctl.launch.process import ServerHandle


@app.command("launch")
@takes_config_files()
def launch(
    files: ConfigFiles = NO_FILES,
    engine: str | None = typer.Option(
        None,
        "--engine",
        help="auto | sglang | builtin (default: [server] engine; auto = sglang on a GPU host).",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the command(s) and what the engine would ignore; the last line is the command."
    ),
    write_yaml: Path | None = typer.Option(
        None, "--write-yaml", help="Write the equivalent SGLang --config YAML to this file."
    ),
    k8s: Path | None = typer.Option(None, "--k8s", help="Write Kubernetes manifests for the same deployment."),
    k8s_image: str | None = typer.Option(None, "--k8s-image", help="Container image for --k8s."),
    force: bool = typer.Option(False, "--force", help="Overwrite files written by --write-yaml / --k8s."),
    detach: bool = typer.Option(False, "--detach", help="Leave the server running in the background."),
    allow_ignored: bool = typer.Option(
        False, "--allow-ignored", help="Launch although the engine would ignore some settings."
    ),
    sglang_version: str | None = typer.Option(
        None, "--sglang-version", help="Write SGLang flags for this version (default: the installed one)."
    ),
    timeout: float = typer.Option(
        900.0, "--timeout", min=1.0, max=86_400.0, help="Seconds to wait for the server to become healthy."
    ),
    as_json: bool = json_option("the plan / result"),
) -> None:
    """Serve CONFIG with SGLang or the bundled runtime; wait until ready and show the pools it allocated.

    Without --detach it stays in the foreground: SIGTERM, SIGINT (Ctrl-C) and SIGHUP stop the server too, and launch
    exits 128 + the signal number once it is gone.
    """

    from rich.console import Console

    from hybridctl.cli.validate_cmd import render_report
    from hybridctl.config.loader import settings_path_for
    from hybridctl.launch.plan import auto_engine_here, make_launch_plan
    from hybridctl.launch.translate import LaunchError
    from hybridctl.rules.check import check_files

    console = Console(highlight=False, soft_wrap=True)
    config = files.config or DEFAULT_CONFIG
    settings = settings_path_for(config, files.settings)
    engine_name = engine_option(engine)
    _check_sglang_version(sglang_version)
    _note_unused(k8s_image=k8s_image is not None and k8s is None, force=force and write_yaml is None and k8s is None,
                 detach=detach and dry_run)  # fmt: skip
    report = check_files(
        config, settings, engine_version=sglang_version, engine=engine_name, auto_engine=auto_engine_here()
    )
    if report.errors or report.config is None:
        render_report(report)
        raise typer.Exit(2)
    cfg = report.config
    try:
        # A dry run shows the command (and writes --write-yaml / --k8s) whatever the engine would ignore, and
        # lists those keys; a launch refuses them.
        accept_ignored = allow_ignored or dry_run
        plan = make_launch_plan(cfg, engine_name, sglang_version=sglang_version, allow_ignored=accept_ignored)
        written = _write_files(cfg, plan, write_yaml, k8s, k8s_image, force, accept_ignored)
    except (LaunchError, OSError) as exc:  # OSError: WouldOverwriteError, WriteFailed
        raise fail(str(exc)) from None
    for path in written:
        console.print(f"wrote {path}")
    if dry_run:
        _print_dry_run(console, plan, allow_ignored, as_json)
        return
    _serve(console, config, settings, plan, detach, timeout, as_json)


def _note_unused(*, k8s_image: bool, force: bool, detach: bool) -> None:
    """Options given where they do nothing: said on stderr (stdout's last line stays the dry run's command)."""
    unused = {
        "--k8s-image": (k8s_image, "it names the image of --k8s's manifests, and no --k8s was given"),
        "--force": (force, "it lets --write-yaml / --k8s overwrite, and neither was given"),
        "--detach": (detach, "a dry run starts nothing"),
    }
    for flag, (on, why) in unused.items():
        if on:
            typer.echo(f"note: {flag} ignored: {why}", err=True)


def _check_sglang_version(sglang_version: str | None) -> None:
    if sglang_version is not None:
        from hybridshared.flags.sglang_version import VersionError, version_key

        try:
            version_key(sglang_version)
        except VersionError as exc:
            raise fail(f"--sglang-version: {exc}") from None


def _print_dry_run(console: Console, plan: LaunchPlan, allow_ignored: bool, as_json: bool) -> None:
    """The plan, then the command(s); the last line is the command itself, shell-quoted."""
    from hybridctl.launch.render import render_plan

    if as_json:
        print_json({**plan.to_dict(), "launch_refuses_ignored": bool(plan.ignored) and not allow_ignored})
        return
    render_plan(console, plan, allowed=allow_ignored)
    for command in plan.commands[:-1]:
        console.print(f"# {command.role} server ({command.url}):")
        typer.echo(command.shell())
    if len(plan.commands) > 1:
        console.print(f"# {plan.commands[-1].role} ({plan.commands[-1].url}):")
    typer.echo(plan.commands[-1].shell())


def _write_files(
    cfg: HybridConfig,
    plan: LaunchPlan,
    write_yaml: Path | None,
    k8s: Path | None,
    k8s_image: str | None,
    force: bool,
    allow_ignored: bool,
) -> list[Path]:
    from hybridctl.config.atomic_write import write_files

    files: dict[Path, str] = {}
    if write_yaml is None and k8s is None:
        return []
    from hybridctl.launch.translate import target_version

    version = plan.version or target_version(None, cfg.config.server.sglang_version)
    if write_yaml is not None:
        from hybridctl.launch.sglang import sglang_translation, to_config_yaml

        text, leftover = to_config_yaml(sglang_translation(cfg, version, allow_ignored).flags, version)
        if leftover:
            text += "# pass on the command line too (not allowed in the file): " + shlex.join(leftover) + "\n"
        files[write_yaml] = text
    if k8s is not None:
        from hybridctl.launch.k8s import k8s_manifests

        files[k8s] = k8s_manifests(cfg, version, image=k8s_image, allow_ignored=allow_ignored)
    return write_files(files, force=force) if files else []


def _serve(
    console: Console,
    config: Path,
    settings: Path,
    plan: LaunchPlan,
    detach: bool,
    timeout: float,
    as_json: bool,
) -> None:

    from rich.markup import escape

    from hybridctl.launch.foreground import follow, forwarded_signals
    from hybridctl.launch.process import StartupFailed, StopSignal, start_server
    from hybridctl.launch.render import render_plan
    from hybridctl.launch.translate import LaunchError

    render_plan(console, plan)
    handle = None
    # SIGTERM, SIGINT and SIGHUP reach the servers too (they run in their own session), during start-up as well.
    with forwarded_signals():
        try:
            with console.status("starting ...") as status:

                def progress(role: str, waited: float, line: str) -> None:
                    status.update(f"[bold]{role}[/] starting, {waited:.0f}s: [dim]{escape(line[-120:])}[/]")

                try:
                    handle = start_server(config, settings, plan=plan, startup_timeout_s=timeout, on_progress=progress)
                except StartupFailed as exc:
                    raise fail(str(exc), 1) from None
                except LaunchError as exc:
                    raise fail(str(exc), 2) from None
            _render_ready(console, handle, as_json)
            if detach:
                if not as_json:
                    console.print(
                        f"detached; state in {escape(str(handle.state_path))}; stop with `{_stop_command(config)}`"
                    )
                return
            console.print("[dim]following the log; Ctrl-C (or SIGTERM) stops the server[/]")
            code = follow(handle, lambda chunk: typer.echo(chunk.decode(errors="replace"), nl=False))
        except StopSignal as exc:
            if handle is not None:
                handle.stop(sig=exc.signal)
            code = exc.exit_code
    if code == 1:
        console.print(f"[red]the server exited on its own[/]; see {escape(str(handle.log_path if handle else ''))}")
    else:
        console.print(f"stopped the server on {signal.Signals(code - 128).name}", highlight=False)
    raise typer.Exit(code)


def _render_ready(console: Console, handle: ServerHandle, as_json: bool) -> None:
    from rich.markup import escape

    from hybridctl.launch.render import render_startup

    if as_json:
        print_json({
            "url": handle.url, "pid": handle.pid, "log": str(handle.log_path),
            "state": str(handle.state_path),
            "startup": {role: info.to_dict() for role, info in handle.startup.items()},
        })  # fmt: skip
        return
    for role, info in handle.startup.items():
        render_startup(console, role, info)
    console.print(f"[green]ready[/] at {handle.url} (pid {handle.pid}); log {escape(str(handle.log_path))}")


def _stop_command(config: Path) -> str:
    from rich.markup import escape

    return escape(shlex.join(["hybridctl", "stop", str(config)]))


def _recorded_config(config: Path, command: str) -> Path:
    """`config`, when it is a file or a server launched from it is recorded; else exit 2 naming the file.

    The state file lives beside the config, so a mistyped path would otherwise read as "nothing runs". A server
    whose config was deleted after launch still has its state file, and is still reported or stopped.
    """
    from hybridctl.launch.state import state_path_for

    try:
        if config.is_file() or state_path_for(config).exists():
            return config
        problem = "is a directory, not a config file" if config.is_dir() else "does not exist"
    except OSError as exc:  # a name the filesystem refuses (too long, ...)
        problem = f"cannot be read ({exc.strerror})"
    raise fail(
        f"{config} {problem}, so no server can have been launched from it. Fix: pass the config.toml the server "
        f"was launched from (`hybridctl {command} PATH/config.toml`)."
    )


@app.command("status")
@takes_config_files(reads_settings=False)
def status(
    files: ConfigFiles = NO_FILES,
    as_json: bool = json_option("the status"),
) -> None:
    """Is the server launched from CONFIG alive and healthy? Exit 0 healthy, 1 unhealthy, 2 no such config (or a
    corrupt state file), 3 not running."""

    from rich.console import Console
    from rich.markup import escape

    from hybridctl.launch.recorded import server_status

    config = _recorded_config(files.config or DEFAULT_CONFIG, "status")
    console = Console(highlight=False, soft_wrap=True)
    try:
        st = server_status(config)
    except ValueError as exc:
        raise fail(str(exc)) from None
    code = 3 if not st.running else (0 if st.healthy else 1)
    if as_json:
        print_json(st.to_dict())
        raise typer.Exit(code)
    if st.state is None:
        console.print(f"not running (no state file {escape(st.state_path)})")
    else:
        health = "healthy" if st.healthy else ("UNHEALTHY" if st.running else "-")
        console.print(f"{'running' if st.running else 'not running'}: {st.state.url} ({st.state.engine}), {health}")
        for p in st.state.processes:
            alive = "alive" if st.alive.get(p.pid) else "dead"
            console.print(f"  {p.role}: pid {p.pid} {alive}, {p.url}, log {escape(p.log_path)}")
        for reason in st.stale:
            console.print(f"  [yellow]stale:[/] {escape(reason)}")
        if st.stale:
            console.print(
                f"stale state file {escape(st.state_path)}: its pids are not the server any more. Fix: make sure "
                f"no server from this config runs, then remove it ({escape(shlex.join(['rm', st.state_path]))})."
            )
        elif not st.running:
            console.print(f"stale state file {escape(st.state_path)}; `{_stop_command(config)}` removes it")
    raise typer.Exit(code)


@app.command("stop")
@takes_config_files(reads_settings=False)
def stop(
    files: ConfigFiles = NO_FILES,
    # At most a day, as launch's: inf would reach time arithmetic as a deadline that never comes.
    timeout: float = typer.Option(
        20.0, "--timeout", min=0.0, max=86_400.0, help="Seconds between SIGTERM and SIGKILL."
    ),
    as_json: bool = json_option("the result"),
) -> None:
    """Stop the server launched from CONFIG: SIGTERM, then SIGKILL after --timeout; removes the state file."""
    from dataclasses import asdict

    from rich.console import Console

    from hybridctl.launch.recorded import stop_server

    config = _recorded_config(files.config or DEFAULT_CONFIG, "stop")
    console = Console(highlight=False, soft_wrap=True)
    try:
        result = stop_server(config, timeout_s=timeout)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if as_json:
        print_json(asdict(result) if result else {"stopped": [], "killed": [], "already_gone": []})
        return
    if result is None:
        console.print("nothing to stop (no server recorded for this config)")
        return
    for pid in result.stopped:
        console.print(f"stopped pid {pid}")
    for pid in result.killed:
        console.print(f"[yellow]killed pid {pid}[/] (did not exit within {timeout:.0f}s of SIGTERM)")
    for pid in result.already_gone:
        console.print(f"pid {pid} had already exited")
