"""`status` and `stop` check the state file before they believe it, and never signal what they did not start.

Each case writes a state file beside a config, runs the real CLI in its own session (so that a `stop` that
signalled its own group would end only itself) and checks: the exit code, one error naming the file and the fix, no
traceback, the file kept, and a live unrelated process (a `sleep`) untouched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridctl.launch.state import StateFileError, process_alive, process_start_ticks, read_state, state_path_for


def _hybridctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hybridctl", *args], capture_output=True, text=True, timeout=60,
                          start_new_session=True)  # fmt: skip


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated live process that leads its own group, as a server would: what a bad file must not reach."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


_NO_PID = 4_194_000  # above any pid a test box hands out: even an old, trusting `stop` signals nothing real


def _state(pid: object, start_ticks: object, argv: object) -> dict[str, object]:
    entry = {"role": "server", "pid": pid, "start_ticks": start_ticks, "url": "http://127.0.0.1:9",
             "log_path": "/tmp/x.log", "argv": argv}  # fmt: skip
    return {"engine": "builtin", "url": "http://127.0.0.1:9", "config_path": "c", "settings_path": "s",
            "started_at": 0.0, "processes": [entry], "version": None}  # fmt: skip


def _write(tmp_path: Path, content: bytes | object) -> tuple[Path, Path]:
    config = tmp_path / "config.toml"
    config.write_text("")
    path = state_path_for(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return config, path


def _assert_refused(proc: subprocess.CompletedProcess[str], path: Path, word: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode not in (0, -signal.SIGTERM, 128 + signal.SIGTERM), out
    assert "Traceback" not in out, out
    assert word in out and str(path) in out.replace("\n", "") and "remove" in out, out
    assert path.exists()


CORRUPT: dict[str, object] = {
    "pid 0 (its own process group)": _state(0, 1, ["x"]),
    "pid -1 (every process)": _state(-1, 1, ["x"]),
    "pid as text": _state("abc", 1, ["x"]),
    "pid true": _state(True, 1, ["x"]),
    "pid float": _state(1234.5, 1, ["x"]),
    "argv not a list": _state(_NO_PID, 1, "x"),
    "start_ticks text": _state(_NO_PID, "1", ["x"]),
    "a top-level list": [_state(_NO_PID, 1, ["x"])],
    "a top-level string": "server",
    "an empty object": {},
    "no processes": {**_state(_NO_PID, 1, ["x"]), "processes": []},
    "an entry that is a number": {**_state(_NO_PID, 1, ["x"]), "processes": [7]},
    "garbage bytes": b"\x00\xff\xfe not json",
    "truncated json": b'{"engine": "builtin", "processes": [',
}


@pytest.mark.parametrize("command", ["status", "stop"])
@pytest.mark.parametrize("case", list(CORRUPT))
def test_a_corrupt_state_file_is_named_and_nothing_is_signalled(tmp_path: Path, case: str, command: str) -> None:
    config, path = _write(tmp_path, CORRUPT[case])
    proc = _hybridctl(command, str(config))
    _assert_refused(proc, path, "corrupt")
    assert proc.returncode == 2


@pytest.mark.parametrize("pid", [1, os.getpid(), os.getpgrp()])
def test_init_this_process_and_its_group_are_never_a_server(tmp_path: Path, pid: int) -> None:
    # Checked in-process: run through an old `stop`, pid 1 would signal init's whole process group.
    _config, path = _write(tmp_path, _state(pid, 1, ["x"]))
    with pytest.raises(StateFileError, match=f"pid = {pid} .*remove {path}"):
        read_state(path)


@pytest.mark.parametrize("missing", ["pid", "start_ticks", "argv", "role"])
def test_a_missing_key_is_named(tmp_path: Path, missing: str) -> None:
    state = _state(_NO_PID, 1, ["x"])
    del state["processes"][0][missing]  # type: ignore[index]
    config, path = _write(tmp_path, state)
    proc = _hybridctl("stop", str(config))
    _assert_refused(proc, path, "corrupt")
    assert repr(missing) in proc.stderr


@pytest.mark.parametrize("command", ["status", "stop"])
def test_start_ticks_null_with_a_live_unrelated_pid_is_not_killed(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], command: str
) -> None:
    config, path = _write(tmp_path, _state(sleeper.pid, None, ["sleep", "300"]))
    proc = _hybridctl(command, str(config), "--timeout", "1") if command == "stop" else _hybridctl(command, str(config))
    _assert_refused(proc, path, "corrupt")
    assert sleeper.poll() is None and process_alive(sleeper.pid, None)


@pytest.mark.parametrize(
    "ticks_delta, argv, why",
    [(1, ["sleep", "300"], "another time"), (0, ["python", "-m", "runtime"], "another command")],
)
def test_a_reused_pid_is_stale_and_survives_stop(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], ticks_delta: int, argv: list[str], why: str
) -> None:
    ticks = process_start_ticks(sleeper.pid)
    assert ticks is not None
    config, path = _write(tmp_path, _state(sleeper.pid, ticks + ticks_delta, argv))
    stopped = _hybridctl("stop", str(config), "--timeout", "1")
    _assert_refused(stopped, path, "stale")
    assert why in stopped.stderr
    status = _hybridctl("status", str(config))
    assert status.returncode == 3 and "stale" in status.stdout and why in status.stdout, status.stdout
    assert sleeper.poll() is None


def test_a_valid_state_file_still_stops_its_process(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    # The control for the cases above: the same file with the true start time and command line is obeyed.
    config, path = _write(tmp_path, _state(sleeper.pid, process_start_ticks(sleeper.pid), ["sleep", "300"]))
    status = _hybridctl("status", str(config), "--json")
    assert json.loads(status.stdout)["running"] and status.returncode == 1  # alive, /health does not answer
    stopped = _hybridctl("stop", str(config), "--json")
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["stopped"] == [sleeper.pid]
    assert sleeper.wait(timeout=10) == -signal.SIGTERM
    assert not path.exists()


def test_a_state_file_of_exited_processes_is_removed_by_stop(tmp_path: Path) -> None:
    done = subprocess.Popen(["true"], start_new_session=True)
    done.wait()
    config, path = _write(tmp_path, _state(done.pid, 1, ["true"]))
    assert _hybridctl("status", str(config)).returncode == 3
    stopped = _hybridctl("stop", str(config), "--json")
    assert stopped.returncode == 0 and json.loads(stopped.stdout)["already_gone"] == [done.pid]
    assert not path.exists()


def test_launch_refuses_beside_a_corrupt_state_file(tmp_path: Path) -> None:
    # It could be a server this config started: launch names the file instead of starting a second one over it.
    from hybridctl.launch import LaunchError, start_server
    from hybridctl.launch.command import EngineCommand
    from hybridctl.launch.plan import LaunchPlan

    config, path = _write(tmp_path, _state(None, 1, ["x"]))
    plan = LaunchPlan("builtin", "test", [EngineCommand("builtin", "server", ["true"], "127.0.0.1", 9)])
    with pytest.raises(LaunchError, match="corrupt.*remove"):
        start_server(config, plan=plan)
    assert path.exists() and not (tmp_path / "hybridctl-server.log").exists()


def test_launch_beside_a_running_server_names_the_stop_that_works(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    # launch refuses while this config's server runs; the fix is the stop of *this* config (a bare
    # `hybridctl stop` reads ./config.toml, which may be another one or none).
    import time

    from hybridctl.launch import LaunchError, start_server
    from hybridctl.launch.command import EngineCommand
    from hybridctl.launch.plan import LaunchPlan

    deadline = time.monotonic() + 60
    while not Path(f"/proc/{sleeper.pid}/cmdline").read_bytes().startswith(b"sleep"):  # exec'd yet?
        assert time.monotonic() < deadline
        time.sleep(0.01)
    config, _path = _write(tmp_path, _state(sleeper.pid, process_start_ticks(sleeper.pid), ["sleep", "300"]))
    plan = LaunchPlan("builtin", "test", [EngineCommand("builtin", "server", ["true"], "127.0.0.1", 9)])
    with pytest.raises(LaunchError, match="already runs") as refused:
        start_server(config, plan=plan)
    assert f"hybridctl stop {config}" in str(refused.value)
    stopped = _hybridctl("stop", str(config), "--json")  # and that command does stop it
    assert stopped.returncode == 0 and json.loads(stopped.stdout)["stopped"] == [sleeper.pid]
