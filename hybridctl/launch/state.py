"""The launch state file next to the config (`.hybridctl/server.json`): which processes serve, where, logs.

Written atomically when a server starts, read by `status` and `stop`, removed by `stop`. A pid alone can be
reused by the OS after the server died, so each entry also records the process's start time (from /proc) and
is only treated as ours while both match.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hybridctl.config.atomic_write import write_text_atomic

STATE_DIR = ".hybridctl"
STATE_NAME = "server.json"
LOG_NAME = "hybridctl-server.log"


@dataclass
class ProcessEntry:
    role: str  # server | prefill | decode | router
    pid: int
    start_ticks: int | None  # /proc/<pid>/stat field 22; None where /proc is unavailable
    url: str
    log_path: str
    argv: list[str]

    def alive(self) -> bool:
        return process_alive(self.pid, self.start_ticks)


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
    def from_json(cls, text: str) -> ServerState:
        data = json.loads(text)
        data["processes"] = [ProcessEntry(**p) for p in data.get("processes", [])]
        return cls(**data)

    @property
    def log_path(self) -> str:
        return self.processes[0].log_path if self.processes else ""

    def any_alive(self) -> bool:
        return any(p.alive() for p in self.processes)


def state_path_for(config_path: str | os.PathLike[str]) -> Path:
    return Path(config_path).resolve().parent / STATE_DIR / STATE_NAME


def log_path_for(config_path: str | os.PathLike[str], role: str = "server") -> Path:
    name = LOG_NAME if role == "server" else LOG_NAME.replace("server", f"server-{role}")
    return Path(config_path).resolve().parent / name


def write_state(path: Path, state: ServerState) -> None:
    write_text_atomic(path, state.to_json())


def read_state(path: Path) -> ServerState | None:
    """The state at `path`, or None when there is none. A corrupt file raises ValueError naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return ServerState.from_json(text)
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(
            f"{path} is not a hybridctl state file ({exc}). Fix: stop the server by hand if one runs, then "
            f"delete {path}."
        ) from None


def remove_state(path: Path) -> None:
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()  # only when empty: other tools may keep files there
    except OSError:
        pass


def process_start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses; fields after the last ")" are fixed.
    rest = stat.rsplit(")", 1)[1].split()
    return int(rest[19])


def process_alive(pid: int, start_ticks: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else; cannot be ours if the start time differs (checked below)
    stat_path = Path(f"/proc/{pid}/stat")
    if stat_path.exists():
        stat = stat_path.read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False  # exited, not yet reaped
        if start_ticks is not None and process_start_ticks(pid) != start_ticks:
            return False  # the pid now belongs to another process
    return True
