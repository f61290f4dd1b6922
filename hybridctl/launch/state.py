"""The launch state file next to the config (`.hybridctl/server.json`): which processes serve, where, logs.

Written atomically when a server starts, read by `status` and `stop`, removed by `stop`. `stop` sends signals to
the pids it records, so the file is checked before it is believed: every field must have its type, a pid must be
above 1 and not this process or its group, and a live pid only counts as the server while its start time (from
/proc), its command line and its own process group still match what was recorded. A pid alone can be reused by
the OS after the server died; a corrupt file must never make `stop` signal an unrelated process (or itself).
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from hybridctl.config.atomic_write import write_text_atomic
from hybridshared import paths

STATE_DIR = ".hybridctl"
STATE_NAME = "server.json"
LOG_NAME = "hybridctl-server.log"
ROLES = ("server", "prefill", "decode", "router")
# pid_t is a signed 32-bit int on every OS hybridctl runs on: a larger recorded pid names no process, and os.kill
# raises OverflowError for it instead of ProcessLookupError.
PID_MAX = 2**31 - 1


class StateFileError(ValueError):
    """The state file is corrupt, or records processes that are not the server any more; names file and fix."""


@dataclass(frozen=True)
class Identity:
    """What a recorded pid is now: the server that was started (ours), no process (gone), or another one."""

    status: Literal["ours", "gone", "other"]
    reason: str = ""


@dataclass
class ProcessEntry:
    role: str  # server | prefill | decode | router
    pid: int
    start_ticks: int | None  # /proc/<pid>/stat field 22; required in a state file that is read back
    url: str
    log_path: str
    argv: list[str]

    def identity(self) -> Identity:
        return process_identity(self.pid, self.start_ticks, self.argv)

    def alive(self) -> bool:
        return self.identity().status == "ours"


@dataclass
class ServerState:
    engine: str
    url: str  # the public address (the router's under PD)
    config_path: str
    settings_path: str
    started_at: float
    processes: list[ProcessEntry] = field(default_factory=list)
    version: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, path: Path | str = STATE_NAME) -> ServerState:
        """Parse and check a state file's text; StateFileError names `path`, the key and the fix."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise _corrupt(path, f"it is not JSON ({exc})") from None
        except RecursionError:  # json's decoder recurses once per nesting level: "[[[[..." deeper than the stack
            raise _corrupt(path, "it is not a state file (JSON nested thousands of levels deep)") from None
        return _state_from(data, Path(path))

    @property
    def log_path(self) -> str:
        return self.processes[0].log_path if self.processes else ""

    def any_alive(self) -> bool:
        return any(p.alive() for p in self.processes)


def _corrupt(path: Path | str, what: str) -> StateFileError:
    return StateFileError(
        f"{path} is corrupt: {what}; nothing was signalled. Fix: if a server from this config still runs, stop "
        f"it by hand (its log says its pid), then remove {path} ({shlex.join(['rm', str(path)])})."
    )


# What each Python type is called in a JSON file, for "pid = "abc" is not an integer".
_JSON_KIND: dict[type, str] = {
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
    type(None): "null",
}


def _field(data: dict[str, Any], key: str, kinds: tuple[type, ...], path: Path, where: str) -> Any:
    if key not in data:
        raise _corrupt(path, f"{where} has no {key!r}")
    value = data[key]
    # bool is an int in Python; a pid of `true` is as corrupt as one of "abc".
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join(_JSON_KIND.get(k, k.__name__) for k in kinds)
        raise _corrupt(path, f"{where} {key} = {json.dumps(value)} is not {names}")
    return value


def _entry_from(data: Any, path: Path, index: int) -> ProcessEntry:
    where = f"processes[{index}]"
    if not isinstance(data, dict):
        raise _corrupt(path, f"{where} is {json.dumps(data)}, not an object")
    role = _field(data, "role", (str,), path, where)
    if role not in ROLES:
        raise _corrupt(path, f"{where} role = {role!r} is not one of {', '.join(ROLES)}")
    pid = _field(data, "pid", (int,), path, where)
    if pid <= 1:
        raise _corrupt(path, f"{where} pid = {pid} is not a server's pid (signalling it would reach every process "
                             "of a group, or init)")  # fmt: skip
    if pid > PID_MAX:
        raise _corrupt(path, f"{where} pid = {pid} is larger than any pid ({PID_MAX}, the largest pid_t)")
    if pid in (os.getpid(), os.getpgrp()):
        raise _corrupt(path, f"{where} pid = {pid} is this hybridctl process (or its process group)")
    start_ticks = _field(data, "start_ticks", (int,), path, where)
    argv = _field(data, "argv", (list,), path, where)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise _corrupt(path, f"{where} argv is not a non-empty list of strings")
    url = _field(data, "url", (str,), path, where)
    log_path = _field(data, "log_path", (str,), path, where)
    return ProcessEntry(role, pid, start_ticks, url, log_path, list(argv))


def _state_from(data: Any, path: Path) -> ServerState:
    if not isinstance(data, dict):
        raise _corrupt(path, f"the top level is a {type(data).__name__}, not an object")
    where = "the file"
    processes = _field(data, "processes", (list,), path, where)
    if not processes:
        raise _corrupt(path, "it records no processes")
    version = _field(data, "version", (str, type(None)), path, where) if "version" in data else None
    return ServerState(
        engine=_field(data, "engine", (str,), path, where),
        url=_field(data, "url", (str,), path, where),
        config_path=_field(data, "config_path", (str,), path, where),
        settings_path=_field(data, "settings_path", (str,), path, where),
        started_at=float(_field(data, "started_at", (int, float), path, where)),
        processes=[_entry_from(p, path, i) for i, p in enumerate(processes)],
        version=version,
    )


def state_path_for(config_path: str | os.PathLike[str]) -> Path:
    return paths.resolve(config_path).parent / STATE_DIR / STATE_NAME


def log_path_for(config_path: str | os.PathLike[str], role: str = "server") -> Path:
    name = LOG_NAME if role == "server" else LOG_NAME.replace("server", f"server-{role}")
    return paths.resolve(config_path).parent / name


def write_state(path: Path, state: ServerState) -> None:
    write_text_atomic(path, state.to_json())


def read_state(path: Path) -> ServerState | None:
    """The state at `path`, or None when there is none. A corrupt file raises StateFileError naming it."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateFileError(
            f"{path} cannot be read ({exc.strerror}). Fix: it must be a readable file; check its permissions, or "
            "remove it if no server from this config runs."
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _corrupt(path, "it is not UTF-8 text") from None
    return ServerState.from_json(text, path)


def remove_state(path: Path) -> None:
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()  # only when empty: other tools may keep files there
    except OSError:
        pass


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (state) on, or None when there is no such process or no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses; fields after the last ")" are fixed.
    return stat.rsplit(")", 1)[1].split()


def process_start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def process_argv(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="surrogateescape") for part in raw.split(b"\0")[:-1]]


def process_identity(pid: int, start_ticks: int | None, argv: list[str]) -> Identity:
    """Is `pid` still the process that was started with `argv` at `start_ticks` (and leads its own group)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return Identity("gone")
    except PermissionError:
        return Identity("other", f"pid {pid} belongs to another user")
    fields = _stat_fields(pid)
    if fields is None:
        return Identity("gone")  # exited between the two looks
    if fields[0] == "Z":
        return Identity("gone")  # exited, not yet reaped
    if start_ticks is None or int(fields[19]) != start_ticks:
        return Identity("other", f"pid {pid} started at another time than the recorded server (a reused pid)")
    if int(fields[2]) != pid:
        return Identity("other", f"pid {pid} does not lead its own process group, as a started server does")
    actual = process_argv(pid)
    if actual is not None and actual != argv:
        return Identity("other", f"pid {pid} runs another command ({' '.join(actual)[:120]})")
    return Identity("ours")


def process_alive(pid: int, start_ticks: int | None) -> bool:
    """Whether `pid` runs (and, given `start_ticks`, is still the process that started then)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return False
    return start_ticks is None or int(fields[19]) == start_ticks
