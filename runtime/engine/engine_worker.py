"""The engine process of the process layout (`--engine-process`):
`python -m runtime.engine.engine_worker CMD_FD OUT_FD`.

The server process (runtime/engine/engine_process.py) starts this with one end of two socket pairs: commands
come in on CMD_FD, messages go out on OUT_FD. Here the
engine runs exactly as in the one-process layout, `ThreadedEngineClient`'s loop on its own thread (which builds
the model: the OpenMP start-up rule in engine_thread.py), so this process holds no HTTP, tokenizer or event loop
and the engine thread shares its GIL only with this module's command reader, which sleeps in `recv` between
commands. One message per engine step goes back: all of that step's `RequestOutput`s, the stats snapshot when a
new one was taken, the failure reason once the loop died. Messages are tuples (wire.py names them).

The process stops on the "stop" command or when the server's end of the socket closes (the server died: no
orphan engine). SIGINT is ignored: a terminal's Ctrl-C reaches the whole process group, and the server stops
this process itself, after aborting its requests.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
from typing import Any

from runtime.core.requests import RequestOutput
from runtime.engine.wire import (
    ABORT,
    ADD,
    FLUSH,
    READY,
    REPLY,
    STARTUP_ERROR,
    STEP,
    STOP,
    EngineInit,
    FrameReader,
    abort_output,
    frame,
    recv_blocking,
    rows,
    stats_row,
)

logger = logging.getLogger("runtime.engine")


class _Outbox:
    """Collects a step's outputs on the engine thread and sends them as one message when the step ends."""

    def __init__(self, out: socket.socket, engine: Any) -> None:
        self.out = out
        self.engine = engine  # ThreadedEngineClient (torch is imported only once the process runs)
        self.lock = threading.Lock()  # the engine thread sends steps, the command reader sends replies
        self._outputs: list[RequestOutput] = []
        self._stats_version = -1
        self._failure_sent = False

    def on_output(self, out: RequestOutput) -> None:  # engine thread
        self._outputs.append(out)

    def step_done(self) -> None:  # engine thread, after the step's outputs and stats refresh
        version = self.engine.stats_version
        failure = self.engine.failure()
        new_failure = failure is not None and not self._failure_sent
        if not self._outputs and version == self._stats_version and not new_failure:
            return
        outputs, self._outputs = self._outputs, []
        stats = stats_row(self.engine.stats()) if version != self._stats_version else None
        self._stats_version = version
        self._failure_sent = self._failure_sent or new_failure
        self.send((STEP, rows(outputs), stats, failure if new_failure else None))

    def send(self, message: tuple[Any, ...]) -> None:
        data = frame(message)
        try:
            with self.lock:
                self.out.sendall(data)
        except OSError:  # the server is gone; the command reader sees the closed socket and stops the engine
            pass


def _start(out: socket.socket, init: EngineInit) -> Any:
    """Build the engine; None (after telling the server why) when it cannot start."""
    import torch

    from runtime.engine.engine_thread import ThreadedEngineClient

    if init.num_threads is not None:
        torch.set_num_threads(init.num_threads)
    if init.random_seed is not None:
        torch.manual_seed(init.random_seed)
    try:
        return ThreadedEngineClient.start(init.engine_args)
    except BaseException as e:  # noqa: BLE001 - reported to the server, which prints one line and exits 2
        logger.debug("engine start-up failed", exc_info=True)
        text = str(e).strip()
        out.sendall(frame((STARTUP_ERROR, text.splitlines()[0] if text else type(e).__name__)))
        return None


def _add(engine: Any, outbox: _Outbox, request: Any, grammars: Any) -> None:
    """Queue a request; one that cannot be queued (its grammar, a dead engine) finishes at once, alone."""
    try:
        if request.grammar is not None:
            request.grammar = grammars.compile(request.grammar)
        engine.add_request(request, outbox.on_output)
    except Exception as e:  # noqa: BLE001 - this request fails, the engine goes on
        status = 503 if engine.failure() is not None else 400
        outbox.send((STEP, rows([abort_output(request, str(e), status)]), None, None))


def serve(commands: socket.socket, out: socket.socket) -> int:
    """Run the engine until told to stop or the server goes away; the process exit code."""
    reader = FrameReader()
    init: EngineInit = recv_blocking(commands, reader)[0]
    logging.basicConfig(
        level=init.log_level.upper(), format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stdout,
    )  # fmt: skip
    engine = _start(out, init)
    if engine is None:
        return 2
    from runtime.engine.engine_grammars import EngineGrammars

    grammars = EngineGrammars(init.grammar)
    outbox = _Outbox(out, engine)
    engine.add_step_listener(outbox.step_done)
    outbox.send((READY, engine.stats(), engine.resolved_args()))
    running = True
    while running:
        try:
            messages = recv_blocking(commands, reader)
        except (EOFError, OSError):
            logger.info("the server closed the engine's channel; stopping the engine")
            break
        for message in messages:
            if not _command(engine, outbox, grammars, message):
                running = False
                break
    engine.shutdown()  # aborts what still runs; its final outputs go out through the step listener
    out.close()
    return 0


def _command(engine: Any, outbox: _Outbox, grammars: Any, message: tuple[Any, ...]) -> bool:
    """Apply one command; False for "stop"."""
    kind = message[0]
    if kind == ADD:
        _add(engine, outbox, message[1], grammars)
    elif kind == ABORT:
        try:
            engine.abort(message[1])
        except RuntimeError:
            pass  # the engine stopped: its requests were finished already
    elif kind == FLUSH:
        try:
            outbox.send((REPLY, message[1], True, engine.flush_cache()))
        except RuntimeError as e:
            outbox.send((REPLY, message[1], False, str(e)))
    elif kind == STOP:
        return False
    return True


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if len(argv) != 2 or not all(a.isdigit() for a in argv):
        print("usage: python -m runtime.engine.engine_worker CMD_FD OUT_FD (started by the server)", file=sys.stderr)
        return 2
    return serve(socket.socket(fileno=int(argv[0])), socket.socket(fileno=int(argv[1])))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
