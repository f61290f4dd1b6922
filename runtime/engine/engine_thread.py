"""The engine loop in its own thread, behind the thread-safe `EngineClient` the server uses.

Commands (add, abort, flush, stop) go through a queue and are applied between steps, so the scheduler
and pools are only ever touched by the engine thread. Stats are a snapshot refreshed after a step that
changed the set of requests (one arrived, finished, was aborted), after commands, when the engine goes idle,
and otherwise every _STATS_REFRESH_S while tokens stream (building it is a few tens of microseconds of Python,
a percent of a compiled decode token, on the critical path); then the step listeners run (the server's bridge
wakes its event loop there, once for all of the step's outputs).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import torch

from runtime.core.config import EngineArgs
from runtime.core.requests import EngineStats, GenerateRequest, RequestOutput
from runtime.engine.api import EngineClient
from runtime.engine.denormals import flush_denormals_on_this_thread
from runtime.engine.engine_core import EngineCore

logger = logging.getLogger("runtime.engine")

_STATS_LOG_INTERVAL_S = 10.0
# While a steady decode runs, the snapshot's token counters and gauges may lag by this much (SGLang itself
# refreshes its decode metrics every 40 steps); request starts and ends are always seen at once.
_STATS_REFRESH_S = 0.05
# How long the engine, gone idle, waits for a command before it does its idle work (EngineCore.on_idle): a client
# that sends its next request as soon as the last one ends must find the engine free, not faulting pages in.
_IDLE_WORK_DELAY_S = 0.02

_T = TypeVar("_T")


class ThreadedEngineClient(EngineClient):
    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._commands: queue.Queue[tuple[str, Any, Future[Any] | None]] = queue.Queue()
        self._stats_lock = threading.Lock()
        self._stats = core.stats()
        self._stats_key = self._request_set_key()
        self._stats_time = time.monotonic()
        self._stats_version = 0  # bumped with every new snapshot (the process layout forwards only new ones)
        self._resolved = core.resolved_args()
        self._stopped = False
        self._failure: str | None = None  # why the engine loop died (it never should)
        self._step_listeners: list[Callable[[], None]] = []
        self._idle_work_due = True  # EngineCore.on_idle has not run since the last step that did work
        self._idle_work_held = False  # hold_idle_work: on_idle waits (still due) until released
        self._thread = threading.Thread(target=self._loop, name="runtime-engine", daemon=True)

    @classmethod
    def start(cls, args: EngineArgs) -> ThreadedEngineClient:
        """Build the engine on the engine thread itself and start its loop there; start-up errors are raised here.

        Why not build it on the caller's thread: OpenMP keeps a pool of workers per thread that ran a parallel
        region. Loading weights and compiling on the caller's thread would leave it a pool next to the engine
        thread's, more OpenMP threads than cores, and libgomp then cuts every worker's spin to at most 1000
        iterations: a 128-token prefill on 2 threads took 57-66 ms on the engine thread vs 27 ms on the thread
        that built the model (demo model, 2 cores)."""
        threads = torch.get_num_threads()  # the caller's setting (--num-threads); OpenMP's is per thread
        built: Future[ThreadedEngineClient] = Future()

        def boot() -> None:
            flush_denormals_on_this_thread()  # before the first parallel region: its OpenMP workers inherit it
            torch.set_num_threads(threads)
            try:
                client = cls(EngineCore(args))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises it
                built.set_exception(exc)
                return
            client._thread = threading.current_thread()
            if client.core.background_compile is not None:  # wake the idle loop: its stats then say "compiled"
                client.core.background_compile.when_done(lambda: client.call_in_engine(lambda core: None))
                client._refresh_stats()  # in case it finished before the callback was registered
            built.set_result(client)
            client._loop()

        threading.Thread(target=boot, name="runtime-engine", daemon=True).start()
        return built.result()

    # -- EngineClient ----------------------------------------------------------------------------------------

    def add_request(self, req: GenerateRequest, on_output: Callable[[RequestOutput], None]) -> None:
        self._send("add", (req, on_output))

    def add_step_listener(self, listener: Callable[[], None]) -> bool:
        self._step_listeners = [*self._step_listeners, listener]  # a new list: the engine thread iterates it
        return True

    def abort(self, rid: str) -> None:
        if self._failure is not None:
            return  # the dead loop already finished every request it had
        self._send("abort", rid)

    def flush_cache(self) -> bool:
        return bool(self._call("flush", None))

    def hold_idle_work(self, hold: bool) -> None:
        if hold:
            self._idle_work_held = True
            return

        def release(core: EngineCore) -> None:
            # On the engine thread, between commands: its next idle must already see the spell forgotten.
            core.forget_busy_spell()  # what ran while held (the warm-up) is no traffic to size the reserve by
            self._idle_work_held = False

        self._send("call", release)

    def stats(self) -> EngineStats:
        with self._stats_lock:
            return EngineStats(**vars(self._stats))

    def resolved_args(self) -> dict[str, Any]:
        return dict(self._resolved)

    @property
    def stats_version(self) -> int:
        """Changes whenever `stats()` would return a new snapshot."""
        return self._stats_version

    def failure(self) -> str | None:
        if self._failure is None and not self._stopped and not self._thread.is_alive():
            return "the engine thread exited"
        return self._failure

    def call_in_engine(self, fn: Callable[[EngineCore], _T]) -> _T:
        """Run `fn(core)` on the engine thread between two steps and return its result."""
        return self._call("call", fn)

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._send("stop", None)
        self._thread.join(timeout=30)

    # -- engine thread ---------------------------------------------------------------------------------------

    def _send(self, kind: str, payload: Any) -> None:
        if self._stopped and kind != "stop":
            raise RuntimeError("the engine is shut down")
        if self._failure is not None and kind != "stop":
            raise RuntimeError(f"the engine is not running: {self._failure}")
        self._commands.put((kind, payload, None))

    def _call(self, kind: str, payload: Any) -> Any:
        if self._failure is not None:
            raise RuntimeError(f"the engine is not running: {self._failure}")
        fut: Future[Any] = Future()
        self._commands.put((kind, payload, fut))
        return fut.result(timeout=60)

    def _apply(self, kind: str, payload: Any, fut: Future[Any] | None) -> bool:
        sched = self.core.scheduler
        result: Any = None
        if kind == "add":
            req, on_output = payload
            sched.add_request(req, on_output)  # a bad request finishes alone inside (never raises here)
        elif kind == "abort":
            sched.abort(payload)
        elif kind == "flush":
            result = sched.flush_cache()
            if result:
                logger.info("Cache flushed successfully!")
        elif kind == "call":  # runtime/pd: work on the pools, between steps; its error goes to the caller
            try:
                result = payload(self.core)
            except Exception as exc:  # noqa: BLE001 - never kill the engine thread for one caller
                if fut is not None:
                    fut.set_exception(exc)
                return True
        elif kind == "stop":
            for r in [*sched.running, *sched.waiting]:
                sched.abort(r.rid, "The server is shutting down.", 503)
            return False
        if fut is not None:
            if kind in ("flush", "call"):
                # The caller may read stats() as soon as this returns: it must see the pages the command freed
                # or moved, not the snapshot of the step before (which refreshes only after the next step).
                self._refresh_stats()
            fut.set_result(result)
        return True

    def _loop(self) -> None:
        """The loop, and if it dies anyway (a bug): every request fails, the failure is kept for /health."""
        try:
            self._run_loop()
        except BaseException as exc:  # noqa: BLE001 - recorded for the server, which exits non-zero
            self._failure = f"{type(exc).__name__}: {exc}"
            logger.critical("engine loop died: %s", self._failure, exc_info=exc)
            self._fail_everything()

    def _fail_everything(self) -> None:
        """After the loop died: finish every queued, waiting and running request, answer pending calls."""
        message = f"The engine stopped: {self._failure}"
        sched = self.core.scheduler
        for r in [*sched.running, *sched.waiting]:
            try:
                sched.abort(r.rid, message, 503)
            except Exception:  # noqa: BLE001 - best effort: the process is about to exit
                logger.exception("could not fail request %s", r.rid)
        while True:
            try:
                kind, payload, fut = self._commands.get_nowait()
            except queue.Empty:
                break
            if fut is not None:
                fut.set_exception(RuntimeError(message))
            elif kind == "add":
                try:
                    sched.add_request(*payload)
                    sched.abort(payload[0].rid, message, 503)
                except Exception:  # noqa: BLE001
                    logger.exception("could not fail a queued request")
        self._notify_step_listeners()

    def _run_loop(self) -> None:
        last_stats_log = float("-inf")  # the first busy step logs, then every _STATS_LOG_INTERVAL_S
        while True:
            commanded = False
            try:
                # Block only when idle; while requests run, just drain what has arrived (and skip the queue's
                # lock and Empty exception, ~3 us a step, when nothing has).
                block = not self.core.scheduler.has_work
                while block or self._commands.qsize():
                    kind, payload, fut = self._next_command(block)
                    commanded = True
                    if not self._apply(kind, payload, fut):
                        self._refresh_stats()
                        self._notify_step_listeners()
                        return
                    block = False
            except queue.Empty:
                pass
            stepped = False
            try:
                stepped = self.core.step()
                self._idle_work_due = self._idle_work_due or stepped
            except Exception as exc:  # noqa: BLE001 - one bad step must not kill the server; its requests fail
                logger.exception("engine step failed; aborting the requests it was running")
                for r in list(self.core.scheduler.running):
                    self.core.scheduler.abort(r.rid, f"Internal engine error: {type(exc).__name__}: {exc}", 500)
            # Stats first: a reader woken by the step's outputs then sees the step in /metrics too.
            self._refresh_stats(force=commanded or not stepped or not self.core.scheduler.has_work)
            self._notify_step_listeners()
            if self.core.args.log_mamba_state_stats and time.monotonic() - last_stats_log > _STATS_LOG_INTERVAL_S:
                last_stats_log = time.monotonic()
                self.core.log_state_stats()

    def _next_command(self, block: bool) -> tuple[str, Any, Future[Any] | None]:
        """The next command (queue.Empty when none and not `block`). Gone idle after work, the engine makes the
        next request's state slot ready at once, waits _IDLE_WORK_DELAY_S for a command, then does the rest of its
        idle work (dropped when a command arrives, taken up again at the next idle wait: a monitor's /server_info
        every few seconds must not leave it undone), then blocks. Why the slot at once: a cached prompt's first
        state copy into a never-written slot faulted its pages in on the critical path (0.5 of its 1.4 ms of
        scheduling, measured served); the bulk waits, because a client's next request right after the last must
        not find the engine faulting megabytes in."""
        if block and self._idle_work_due and not self._idle_work_held:
            self.core.on_idle(lambda: self._commands.qsize() > 0, next_only=True)
            try:
                return self._commands.get(timeout=_IDLE_WORK_DELAY_S)
            except queue.Empty:
                self._idle_work_due = not self.core.on_idle(lambda: self._commands.qsize() > 0)
        return self._commands.get(block=block, timeout=None)

    def _notify_step_listeners(self) -> None:
        for listener in self._step_listeners:
            try:
                listener()
            except Exception:  # noqa: BLE001 - a consumer's bug must not stop the engine
                logger.exception("step listener failed")

    def _request_set_key(self) -> tuple[int, ...]:
        """Changes whenever a request arrives, starts, finishes or is aborted (what a reader waits to see)."""
        sched = self.core.scheduler
        c = sched.counters
        return (
            len(sched.running),
            len(sched.waiting),
            c.num_requests_total,
            c.num_requests_finished,
            c.num_requests_aborted,
            c.num_allocation_failures,
        )

    def _refresh_stats(self, force: bool = True) -> None:
        key = self._request_set_key()
        now = time.monotonic()
        if not force and key == self._stats_key and now - self._stats_time < _STATS_REFRESH_S:
            return
        stats = self.core.stats()
        self._stats_key, self._stats_time = key, now
        with self._stats_lock:
            self._stats = stats
            self._stats_version += 1


def start_engine(args: EngineArgs) -> ThreadedEngineClient:
    """Load the model and tokenizer, size and allocate both pools (logging them), start the engine thread."""
    return ThreadedEngineClient.start(args)
