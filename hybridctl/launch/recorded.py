"""`status` and `stop` of the server a state file records: `server_status`, `stop_server`.

Nothing is signalled until the whole file has been checked (state.py): a corrupt file raises StateFileError, and a
recorded pid that is now another process (reused pid, other command line) makes `stop` refuse and touch nothing.
"""

from __future__ import annotations

import os
import shlex
import signal
from dataclasses import asdict, dataclass

from hybridctl.launch.process import StopResult, is_healthy, stop_processes
from hybridctl.launch.state import Identity, ServerState, StateFileError, read_state, remove_state, state_path_for


@dataclass
class ServerStatus:
    state_path: str
    running: bool
    state: ServerState | None
    alive: dict[int, bool]  # pid -> alive (and still the recorded process)
    healthy: bool | None  # /health of the public url; None when nothing runs
    stale: list[str]  # why recorded pids are not the server any more (reused pids); empty when none

    def to_dict(self) -> dict[str, object]:
        return {
            "state_path": self.state_path,
            "running": self.running,
            "healthy": self.healthy,
            "url": self.state.url if self.state else None,
            "engine": self.state.engine if self.state else None,
            "stale": self.stale,
            "processes": [
                {**asdict(p), "alive": self.alive.get(p.pid, False)}
                for p in (self.state.processes if self.state else [])
            ],
        }


def _identities(state: ServerState) -> dict[int, Identity]:
    return {p.pid: p.identity() for p in state.processes}


def server_status(config_path: str | os.PathLike[str]) -> ServerStatus:
    """What the state file beside `config_path` records and what of it runs. Raises StateFileError if corrupt."""
    state_path = state_path_for(config_path)
    state = read_state(state_path)
    if state is None:
        return ServerStatus(str(state_path), False, None, {}, None, [])
    ids = _identities(state)
    alive = {pid: i.status == "ours" for pid, i in ids.items()}
    stale = [i.reason for i in ids.values() if i.status == "other"]
    running = any(alive.values())
    return ServerStatus(str(state_path), running, state, alive, is_healthy(state.url) if running else None, stale)


def stop_server(
    config_path: str | os.PathLike[str], timeout_s: float = 20.0, sig: signal.Signals = signal.SIGTERM
) -> StopResult | None:
    """Stop what the state file next to `config_path` records and remove the file.

    Returns None when there is no state file (nothing to stop). Raises StateFileError, having signalled nothing and
    kept the file, when it is corrupt or a recorded pid is now another process.
    """
    state_path = state_path_for(config_path)
    state = read_state(state_path)
    if state is None:
        return None
    others = [i.reason for i in _identities(state).values() if i.status == "other"]
    if others:
        raise StateFileError(
            f"{state_path} is stale: {'; '.join(others)}. Nothing was signalled. Fix: make sure no server from "
            f"this config still runs, then remove {state_path} ({shlex.join(['rm', str(state_path)])})."
        )
    result = stop_processes(state.processes, timeout_s, sig=sig)
    remove_state(state_path)
    return result
