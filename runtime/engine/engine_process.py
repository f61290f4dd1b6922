"""`EngineClient` over a separate engine process (`--engine-process`: SGLang's layout, the HTTP server,
tokenizer and detokenizer apart from the scheduler and model).

In the one-process layout the engine thread and the event loop share a GIL: a compiled forward's fused kernels
hold it, the loop's callbacks hold it, and each waits for the other. Here the engine runs in its own process
(runtime/engine/engine_worker.py) and this client talks to it over a socket pair per direction: requests and
commands go out, one message per engine step comes back with all of that step's outputs, plus the stats snapshot when it
changed (so /metrics, /health and /server_info read a local copy) and the failure reason. The event loop reads
the socket itself (`loop.add_reader`, bound by the server's bridge through `bind_event_loop`): no extra thread,
and `on_output` callbacks and step listeners run on the event loop thread.

The engine process dying (killed, crashed) is an engine failure: every unfinished request ends with a 503, and
`failure()` says why, so /health fails and the server's watchdog exits as for a dead engine thread. Shutdown
stops the process (and kills it if it does not stop); the engine process also stops by itself when the
server's end of the socket closes, so a killed server leaves no engine behind.
"""

from __future__ import annotations

import asyncio
import logging
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from runtime.core.requests import EngineStats, GenerateRequest, RequestOutput
from runtime.engine.api import EngineClient
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
    GrammarSpec,
    abort_output,
    frame,
    outputs,
)

logger = logging.getLogger("runtime.engine")

_STOP_TIMEOUT_S = 30.0  # as the engine thread's join in the one-process layout
_CALL_TIMEOUT_S = 60.0


class ProcessEngineClient(EngineClient):
    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        channels: tuple[socket.socket, socket.socket, FrameReader],
        stats: EngineStats,
        resolved: dict[str, Any],
    ) -> None:
        self._proc = proc
        self._commands, self._out, self._reader = channels  # out: non-blocking, read on the event loop
        self._send_lock = threading.Lock()  # the event loop sends requests, worker threads send flushes
        self._stats = stats
        self._resolved = resolved
        self._sinks: dict[str, Callable[[RequestOutput], None]] = {}
        self._listeners: list[Callable[[], None]] = []
        self._calls: dict[int, Future[Any]] = {}
        self._next_call = 0
        self._failure: str | None = None
        self._stopped = False
        self._closed = False  # the engine's end of `out` closed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._read_lock = threading.Lock()  # reading without an event loop (before one is bound, at shutdown)
        self._gone_lock = threading.Lock()
        self._gone = False

    @classmethod
    def start(cls, init: EngineInit) -> ProcessEngineClient:
        """Start the engine process and wait until its engine is built; RuntimeError with its one-line reason
        when it cannot start."""
        commands, their_commands = socket.socketpair()
        out, their_out = socket.socketpair()
        fds = (their_commands.fileno(), their_out.fileno())
        cmd = [sys.executable, "-m", "runtime.engine.engine_worker", *map(str, fds)]
        proc = subprocess.Popen(cmd, pass_fds=fds)  # same stdout/stderr: one log
        their_commands.close()
        their_out.close()
        out.setblocking(False)
        reader = FrameReader()
        try:
            commands.sendall(frame(init))
            message = _wait_for_message(proc, out, reader)
        except BaseException:
            _stop_process(proc)
            commands.close()
            out.close()
            raise
        if message[0] == READY:
            logger.info("Engine process started (pid %d)", proc.pid)
            return cls(proc, (commands, out, reader), message[1], message[2])
        _stop_process(proc)
        commands.close()
        out.close()
        if message[0] == STARTUP_ERROR:
            raise RuntimeError(message[1])
        raise RuntimeError(f"the engine process sent {message[0]!r} before it was ready")

    @property
    def pid(self) -> int:
        """The engine process's pid."""
        return self._proc.pid

    # -- EngineClient ----------------------------------------------------------------------------------------

    def bind_event_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the engine's messages on `loop` from now on (outputs are delivered on its thread)."""
        if self._loop is not None:
            return
        self._loop = loop
        loop.add_reader(self._out.fileno(), self._read_available)

    def add_request(self, req: GenerateRequest, on_output: Callable[[RequestOutput], None]) -> None:
        self._check_running()
        if req.grammar is not None and not isinstance(req.grammar, GrammarSpec):
            # The server compiled it (a bad grammar is a 400 there); the engine process compiles its own copy.
            req.grammar = GrammarSpec(req.grammar.kind, req.grammar.source)
        self._sinks[req.rid] = on_output
        try:
            self._send((ADD, req))
        except BaseException:
            self._sinks.pop(req.rid, None)
            raise

    def add_step_listener(self, listener: Callable[[], None]) -> bool:
        self._listeners = [*self._listeners, listener]
        return True

    def abort(self, rid: str) -> None:
        if self._failure is not None or self._stopped:
            return  # a dead engine finished every request already
        try:
            self._send((ABORT, rid))
        except RuntimeError:
            pass

    def flush_cache(self) -> bool:
        return bool(self._call(FLUSH))

    def stats(self) -> EngineStats:
        return EngineStats(**vars(self._stats))

    def resolved_args(self) -> dict[str, Any]:
        return dict(self._resolved)

    def failure(self) -> str | None:
        if self._failure is None and not self._stopped:
            code = self._proc.poll()
            if code is not None:
                self._engine_gone(code)
        return self._failure

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._sinks.clear()  # the event loop has ended: the final aborts' outputs have no reader left
        try:
            self._send_raw((STOP,))
        except OSError:
            pass
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        # Keep reading while it stops: its final outputs must not fill the socket and block it.
        while self._proc.poll() is None and time.monotonic() < deadline:
            self._read_blocking(0.1)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._out.fileno())
        _stop_process(self._proc)
        self._commands.close()
        self._out.close()

    # -- the channel -----------------------------------------------------------------------------------------

    def _check_running(self) -> None:
        if self._stopped:
            raise RuntimeError("the engine is shut down")
        failure = self.failure()
        if failure is not None:
            raise RuntimeError(f"the engine is not running: {failure}")

    def _send(self, message: tuple[Any, ...]) -> None:
        self._check_running()
        try:
            self._send_raw(message)
        except OSError:
            self._engine_gone(self._proc.poll())
            raise RuntimeError(f"the engine is not running: {self._failure}") from None

    def _send_raw(self, message: tuple[Any, ...]) -> None:
        data = frame(message)
        with self._send_lock:
            self._commands.sendall(data)

    def _call(self, kind: str) -> Any:
        """Send a command and wait for its reply (from a worker thread, never the event loop's)."""
        future: Future[Any] = Future()
        with self._send_lock:
            call_id = self._next_call
            self._next_call += 1
        self._calls[call_id] = future
        try:
            self._send((kind, call_id))
        except BaseException:
            self._calls.pop(call_id, None)
            raise
        if self._loop is None:  # nothing reads the socket for us
            deadline = time.monotonic() + _CALL_TIMEOUT_S
            while not future.done() and time.monotonic() < deadline:
                self._read_blocking(0.05)
        return future.result(timeout=_CALL_TIMEOUT_S)

    def _read_available(self) -> None:
        """Event loop (or a reader holding `_read_lock`): handle every message that has arrived."""
        while not self._closed:
            try:
                data = self._out.recv(1 << 20)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._closed = True
                if self._loop is not None and not self._loop.is_closed():
                    self._loop.remove_reader(self._out.fileno())
                if not self._stopped:
                    self._engine_gone(_exit_code(self._proc))
                return
            for message in self._reader.feed(data):
                self._handle(message)

    def _read_blocking(self, timeout: float) -> None:
        with self._read_lock:
            if self._closed:
                time.sleep(timeout)  # the process is exiting; the caller polls it
                return
            readable, _, _ = select.select([self._out], [], [], timeout)
            if readable:
                self._read_available()

    def _handle(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == STEP:
            _, output_rows, stats, failure = message
            if stats is not None:
                self._stats = EngineStats(*stats)
            if failure is not None and self._failure is None:
                self._failure = failure
            self._deliver(outputs(output_rows))
        elif kind == REPLY:
            _, call_id, ok, value = message
            future = self._calls.pop(call_id, None)
            if future is not None:
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(RuntimeError(value))

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        sinks = self._sinks
        for out in outputs:
            sink = sinks.pop(out.rid, None) if out.finished else sinks.get(out.rid)
            if sink is not None:
                sink(out)
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # noqa: BLE001 - a consumer's bug must not stop the reader
                logger.exception("step listener failed")

    def _engine_gone(self, code: int | None) -> None:
        """The engine process died or closed its end: fail everything it had, as a dead engine thread does.
        Once: the event loop (closed socket) and a caller of `failure()` may both find it gone."""
        with self._gone_lock:
            if self._gone:
                return
            self._gone = True
        if self._failure is None:
            how = "exited" if code is None or code >= 0 else f"was killed by signal {-code}"
            self._failure = f"the engine process {how}" + (f" (exit code {code})" if code and code > 0 else "")
            logger.critical("%s", self._failure)
        message = f"The engine stopped: {self._failure}"
        self._deliver([abort_output(_pending(rid), message, 503) for rid in list(self._sinks)])
        for future in list(self._calls.values()):
            if not future.done():
                future.set_exception(RuntimeError(message))
        self._calls.clear()


def _exit_code(proc: subprocess.Popen[bytes]) -> int | None:
    """Its exit code once it is gone (a closed socket comes a moment before the exit is visible)."""
    try:
        return proc.wait(timeout=0.5)
    except subprocess.TimeoutExpired:
        return None


def _pending(rid: str) -> GenerateRequest:
    return GenerateRequest(rid=rid, input_ids=[])


def _wait_for_message(proc: subprocess.Popen[bytes], out: socket.socket, reader: FrameReader) -> tuple[Any, ...]:
    """The engine process's first message; RuntimeError if it exits first. Start-up (a compile) may take long."""
    while True:
        readable, _, _ = select.select([out], [], [], 0.5)
        if readable:
            try:
                data = out.recv(1 << 20)
            except BlockingIOError:
                data = None
            if data:
                messages = reader.feed(data)
                if messages:
                    first: tuple[Any, ...] = messages[0]
                    return first
            elif data == b"":
                time.sleep(0.1)  # closed: it is exiting
        code = proc.poll()
        if code is not None:
            raise RuntimeError(f"the engine process exited during start-up (exit code {code}); see the log above")


def _stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
