"""A foreground launch: the signals that stop hybridctl stop what it started, then hybridctl exits.

Servers run in their own session (process.py), so a signal sent to hybridctl alone — SIGTERM from systemd, `docker
stop` or the kubelet, SIGINT from Ctrl-C, SIGHUP from a closed terminal — would orphan them with the port taken.
While `forwarded_signals()` is active those three raise StopSignal instead (once; repeats are ignored so that the
clean-up they start is not cut short). `start_server` forwards it to what it already started; `follow` forwards it
to the running servers, waits for them, removes the state file and returns 128 + the signal number.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from hybridctl.launch.process import ServerHandle, StopSignal

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
SERVER_EXITED = 1  # follow's exit code when the server stopped without being told


@contextmanager
def forwarded_signals() -> Iterator[None]:
    """Turn the first SIGTERM, SIGINT or SIGHUP into StopSignal in the main thread; restore the handlers after."""
    raised = False

    def handler(signum: int, _frame: FrameType | None) -> None:
        nonlocal raised
        if not raised:
            raised = True
            raise StopSignal(signum)

    previous = {sig: signal.signal(sig, handler) for sig in FORWARDED}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def follow(
    handle: ServerHandle,
    echo: Callable[[bytes], None],
    poll_s: float = 0.5,
    stop_timeout_s: float = 20.0,
) -> int:
    """Pass the server's new log output to `echo` until it exits or a StopSignal arrives; then stop it.

    Returns SERVER_EXITED when the server ended on its own, else the signal's exit code (143 SIGTERM, 130 SIGINT,
    129 SIGHUP) after that signal went to every process group started and they exited (SIGKILL after
    `stop_timeout_s`). Either way the state file is gone on return. Call inside `forwarded_signals()`.
    """
    path = handle.log_path
    sig, code = signal.SIGTERM, SERVER_EXITED
    try:
        offset = path.stat().st_size if path.exists() else 0
        while handle.alive():
            with open(path, "rb") as log:
                log.seek(offset)
                chunk = log.read()
            if chunk:
                offset += len(chunk)
                echo(chunk)
            time.sleep(poll_s)
    except StopSignal as exc:
        sig, code = exc.signal, exc.exit_code
    handle.stop(stop_timeout_s, sig)
    return code
