"""Start and stop served engines: `start_server` and the handle it returns.

launch and demo call these (status and stop of a recorded server: recorded.py; a foreground launch's signals:
foreground.py). Each server runs in its own session (process group) so that stopping it also stops the workers
SGLang forks; its output goes to a log file next to the config, which the readiness wait reads for the start-up
pool lines.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from hybridctl.config.loader import load_hybrid_config
from hybridctl.config.schema import HybridConfig
from hybridctl.launch.command import EngineCommand
from hybridctl.launch.plan import LaunchPlan, Requested, make_launch_plan
from hybridctl.launch.state import (
    ProcessEntry,
    ServerState,
    StateFileError,
    log_path_for,
    process_start_ticks,
    read_state,
    remove_state,
    state_path_for,
    write_state,
)
from hybridctl.launch.translate import LaunchError
from hybridctl.logs.startup import StartupInfo, parse_startup_text

# (role, seconds waited, last log line) — the CLI draws a progress display from these.
ProgressFn = Callable[[str, float, str], None]


def _server_name(role: str) -> str:
    # A single server's role is "server"; "the server server" would read as a typo.
    return "server" if role == "server" else f"{role} server"


class StartupFailed(LaunchError):
    """A server exited or never became healthy; carries its log path and last lines."""

    def __init__(self, role: str, reason: str, log_path: Path, tail: list[str]) -> None:
        self.role, self.reason, self.log_path, self.tail = role, reason, log_path, tail
        super().__init__(
            f"the {_server_name(role)} {reason}. Last log lines ({log_path}):\n"
            + "\n".join(f"  {line}" for line in tail)
            + f"\nFix: read the log, or run `{shlex.join(['hybridctl', 'doctor', '--log', str(log_path)])}` "
            "for a diagnosis."
        )


class StopSignal(BaseException):
    """SIGTERM, SIGINT or SIGHUP arrived while hybridctl held a server in the foreground (foreground.py raises it).

    A BaseException, like KeyboardInterrupt, so that no `except Exception` on the way swallows it.
    """

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum)
        super().__init__(self.signal.name)

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signal)  # what a shell reports for a process that this signal ended


@dataclass
class ServerHandle:
    """A started server (or PD trio): where it answers, its pids and logs, and what its start-up log said."""

    state: ServerState
    state_path: Path
    startup: dict[str, StartupInfo] = field(default_factory=dict)  # role -> parsed start-up lines
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    @property
    def url(self) -> str:
        return self.state.url

    @property
    def pid(self) -> int:
        return self.state.processes[-1].pid

    @property
    def log_path(self) -> Path:
        return Path(self.state.log_path)

    def alive(self) -> bool:
        self._reap()
        return self.state.any_alive()

    def stop(self, timeout_s: float = 20.0, sig: signal.Signals = signal.SIGTERM) -> StopResult:
        """Send `sig` to every process group started (SIGKILL after `timeout_s`), remove the state file."""
        result = stop_processes(self.state.processes, timeout_s, self._procs, sig)
        remove_state(self.state_path)
        return result

    def _reap(self) -> None:
        for proc in self._procs:
            proc.poll()

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


@dataclass
class StopResult:
    stopped: list[int]  # pids that exited after SIGTERM
    killed: list[int]  # pids that needed SIGKILL
    already_gone: list[int]


def _rotate(log_path: Path) -> None:
    if log_path.exists():
        os.replace(log_path, log_path.with_name(log_path.name + ".1"))


def _tail(path: Path, lines: int = 25) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ["<no log written>"]


def is_healthy(url: str) -> bool:
    """`url`/health answers 200 within 2 s."""

    try:
        return httpx.get(url + "/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def spawn(command: EngineCommand, log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `command` in its own session, output to `log_path` (the previous log kept as .1)."""
    _rotate(log_path)
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            command.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env,
            start_new_session=True, cwd=os.getcwd(),
        )  # fmt: skip


def wait_ready(
    proc: subprocess.Popen[bytes],
    command: EngineCommand,
    log_path: Path,
    timeout_s: float,
    on_progress: ProgressFn | None = None,
    ready_line_grace_s: float = 120.0,
) -> StartupInfo:
    """Block until `command` answers /health with 200 and logged the ready line.

    Raises StartupFailed when it exits or the time runs out.

    SGLang can answer /health before its warm-up request finished and it printed the ready line; the router
    prints no such line, and a server that never prints it is accepted `ready_line_grace_s` after /health.
    """
    started = time.monotonic()
    healthy_since: float | None = None
    while True:
        now = time.monotonic()
        if proc.poll() is not None:
            reason = f"exited with code {proc.returncode} during start-up"
            raise StartupFailed(command.role, reason, log_path, _tail(log_path))
        if healthy_since is None and is_healthy(command.url):
            healthy_since = now
        if healthy_since is not None:
            info = parse_startup_text(log_path.read_text(errors="replace"))
            if info.ready or command.role == "router" or now - healthy_since > ready_line_grace_s:
                return info
        if now - started > timeout_s:
            reason = f"was not healthy at {command.url} after {timeout_s:.0f}s"
            raise StartupFailed(command.role, reason, log_path, _tail(log_path))
        if on_progress is not None:
            tail = _tail(log_path, 1)
            on_progress(command.role, now - started, tail[-1] if tail else "")
        time.sleep(0.5)


def _refuse_if_running(state_path: Path, config_path: str | os.PathLike[str]) -> None:
    try:
        state = read_state(state_path)
    except StateFileError as exc:
        raise LaunchError(str(exc)) from None
    if state is not None and state.any_alive():
        pids = ", ".join(str(p.pid) for p in state.processes if p.alive())
        raise LaunchError(
            f"a server from this config already runs at {state.url} (pid {pids}; state {state_path}). "
            f"Fix: `{shlex.join(['hybridctl', 'stop', str(config_path)])}` first, or use another config directory."
        )


def _refuse_if_engine_missing(plan: LaunchPlan) -> None:

    modules = {c.argv[2] for c in plan.commands if len(c.argv) > 2 and c.argv[1] == "-m"}
    for module in sorted(modules):
        package = module.split(".", 1)[0]
        if importlib.util.find_spec(package) is None:  # finds the package without importing it
            pip_name = package.replace("_", "-")
            raise LaunchError(
                f"{package} is not installed in this Python ({sys.executable}), so `python -m {module}` "
                f"cannot run. Fix: pip install {pip_name}, or use the bundled runtime (--engine builtin)."
            )


def _refuse_if_port_busy(command: EngineCommand) -> None:
    # Something already answering there would pass the readiness check for a server that is still loading.

    host = command.url.split("//", 1)[1].rsplit(":", 1)[0]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        busy = sock.connect_ex((host, command.port)) == 0
    if busy:
        raise LaunchError(
            f"port {command.port} on {host} is already in use, so the {_server_name(command.role)} cannot listen "
            "there. Fix: stop what uses it, or set another port in config.toml ([server] port; under PD [pd] "
            "prefill_port / decode_port / bootstrap_port)."
        )


def start_server(
    config_path: str | os.PathLike[str],
    settings_path: str | os.PathLike[str] | None = None,
    *,
    engine: Requested | None = None,
    detach: bool = True,
    cfg: HybridConfig | None = None,
    plan: LaunchPlan | None = None,
    allow_ignored: bool = False,
    sglang_version: str | None = None,
    startup_timeout_s: float = 900.0,
    on_progress: ProgressFn | None = None,
    env: dict[str, str] | None = None,
    python: str | None = None,
) -> ServerHandle:
    """Start the server(s) for a config, wait until healthy, record them in the state file, return a handle.

    With `detach` the servers keep running after this process exits, until `stop_server` or `handle.stop()`;
    without it they are stopped when this process exits. Either way the handle works as a context manager
    that stops them when the block ends. On a start-up failure everything
    started is stopped and StartupFailed names the log.
    """
    config_path = Path(config_path)
    settings_path = Path(settings_path) if settings_path else config_path.with_name("settings.json")
    if plan is None:
        if cfg is None:
            cfg = load_hybrid_config(config_path, settings_path)
        plan = make_launch_plan(cfg, engine, sglang_version=sglang_version, allow_ignored=allow_ignored,
                                python=python)  # fmt: skip
    if python is None:
        _refuse_if_engine_missing(plan)
    state_path = state_path_for(config_path)
    _refuse_if_running(state_path, config_path)
    for command in plan.commands:
        _refuse_if_port_busy(command)
    state = ServerState(
        engine=plan.engine, url=plan.url, config_path=str(config_path.resolve()),
        settings_path=str(settings_path.resolve()), started_at=time.time(), version=plan.version,
    )  # fmt: skip
    handle = ServerHandle(state=state, state_path=state_path)
    try:
        for command in plan.commands:
            role = command.role
            log_path = log_path_for(config_path, role)
            proc = spawn(command, log_path, env)
            handle._procs.append(proc)
            state.processes.append(ProcessEntry(role, proc.pid, process_start_ticks(proc.pid), command.url,
                                                str(log_path), command.argv))  # fmt: skip
            write_state(state_path, state)  # recorded at once, so `hybridctl stop` works during a long start-up
            handle.startup[role] = wait_ready(proc, command, log_path, startup_timeout_s, on_progress)
    except StopSignal as exc:
        handle.stop(sig=exc.signal)  # forwarded as received: the server sees what hybridctl saw
        raise
    except BaseException:
        handle.stop()
        raise
    if not detach:
        atexit.register(lambda: handle.alive() and handle.stop())
    return handle


def stop_processes(
    entries: list[ProcessEntry],
    timeout_s: float = 20.0,
    procs: list[subprocess.Popen[bytes]] | None = None,
    sig: signal.Signals = signal.SIGTERM,
) -> StopResult:
    """Send `sig` to each process group (newest first: the router before its workers), SIGKILL what is left
    after `timeout_s`. Only entries that are still the recorded process (start time, command line) are
    signalled; the caller checks the state file before."""
    result = StopResult([], [], [])
    by_pid = {p.pid: p for p in procs or []}

    def alive(entry: ProcessEntry) -> bool:
        if entry.pid in by_pid:
            by_pid[entry.pid].poll()
        return entry.alive()

    targets = []
    for entry in reversed(entries):
        if not alive(entry):
            result.already_gone.append(entry.pid)
            continue
        _signal_group(entry.pid, sig)
        targets.append(entry)
    deadline = time.monotonic() + timeout_s
    while targets and time.monotonic() < deadline:
        for entry in [t for t in targets if not alive(t)]:
            targets.remove(entry)
            result.stopped.append(entry.pid)
        time.sleep(0.1)
    for entry in targets:
        _signal_group(entry.pid, signal.SIGKILL)
        result.killed.append(entry.pid)
    for proc in procs or []:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    return result


def _signal_group(pid: int, sig: signal.Signals) -> None:
    # The server leads its own session (start_new_session), so its group id is its pid: the group holds
    # exactly the processes it started.
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)
