"""`--torch-compile-in-background`: the engine is healthy and serves eager at once; a thread builds the compiled
forwards (runtime/engine/compiled_decode.py, compiled_extend.py) and installs them in the model runner when every
graph is ready, so the next step runs compiled.

Why this is safe next to a serving engine:
- Dynamo's frame-evaluation hook is per thread (torch._C._dynamo.eval_frame keeps its callback in thread-local
  state): the engine thread's eager forwards are never traced, only the compile thread's calls.
- The warm-up runs on scratch buffers of the pools' exact shapes and dtypes (`torch.empty`: only the few rows the
  warm-up writes become resident, and they are freed after), never on the pools a request may be using. The graphs
  take the buffers' shapes, not their identity, so the real pools hit the same graphs.
- The compiled objects are built (and read their thread counts) on the engine's thread before this one starts; the
  runner reads `compiled_decode` / `compiled_extend` once per forward, and an attribute store is atomic under
  the GIL, so a forward runs either the eager model or a complete, warmed compiled forward.

The cost: tracing is Python and holds the GIL, and inductor's C++ builds take a core, so eager steps served while it
compiles are slower (docs/performance.md, "Runtime hot path").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from runtime.core.batch import PoolBuffers
from runtime.kvcache.state_pool import StateSlotPool

if TYPE_CHECKING:
    from runtime.engine.compiled_decode import CompiledDecode
    from runtime.engine.compiled_extend import CompiledExtend
    from runtime.engine.model_runner import ModelRunner

logger = logging.getLogger("runtime.engine")


def scratch_buffers(buffers: PoolBuffers) -> PoolBuffers:
    """Uninitialised buffers of the same shapes, strides and dtypes as `buffers`: what the warm-up writes into."""
    return PoolBuffers(
        k=[torch.empty_like(t) for t in buffers.k],
        v=[torch.empty_like(t) for t in buffers.v],
        conv=[torch.empty_like(t) for t in buffers.conv],
        ssm=[torch.empty_like(t) for t in buffers.ssm],
    )


class BackgroundCompile:
    """Warms `decode` and `extend` up on a thread and installs them in `runner`; `runner.compiling` is True until
    then. `state_copy`: the real pool's state copy, which the extend gets back after its warm-up on scratch."""

    def __init__(
        self,
        runner: ModelRunner,
        decode: CompiledDecode | None,
        extend: CompiledExtend | None,
        buffers: PoolBuffers,
    ) -> None:
        self.runner = runner
        self.decode = decode
        self.extend = extend
        self.buffers = buffers
        self.elapsed_s = 0.0
        self.done = threading.Event()
        self._on_done: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="torch-compile", daemon=True)

    def start(self) -> None:
        self.runner.compiling = True
        logger.info("Torch compile: building the compiled forwards in the background; serving eager until then.")
        self.thread.start()

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call `callback` on the compile thread when it finishes; nothing when it already has (whatever reads
        the state now sees it). The engine thread, idle on its command queue, refreshes its stats when woken."""
        with self._lock:
            if not self.done.is_set():
                self._on_done.append(callback)

    def wait(self, timeout: float | None = None) -> bool:
        """True once the compile thread has finished (installed or given up)."""
        return self.done.wait(timeout)

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            scratch = scratch_buffers(self.buffers)
            decode_ok = self.decode is not None and self.decode.warm_up(scratch).enabled
            extend = self.extend
            if extend is not None:
                # Warm-up checkpoints copy states between slots: on the scratch buffers, not a request's.
                real_copy = extend.copy_state
                extend.copy_state = StateSlotPool(len(scratch.ssm[0]) if scratch.ssm else 0, scratch).copy
                try:
                    extend_ok = extend.warm_up(scratch).enabled
                finally:
                    extend.copy_state = real_copy
                if extend_ok:
                    self.runner.compiled_extend = extend
            if decode_ok and self.decode is not None:
                self.runner.compiled_decode = self.decode
            del scratch
        except Exception:  # noqa: BLE001 - the engine keeps serving eager; the log says why
            logger.exception("Torch compile: the background compile failed; the engine stays eager.")
        finally:
            self.elapsed_s = time.perf_counter() - t0
            self.runner.compiling = False
            with self._lock:
                self.done.set()
                callbacks, self._on_done = self._on_done, []
        logger.info(
            "Torch compile: background compile done after %.1f s; now running: %s",
            self.elapsed_s,
            self.runner.compiled_paths(),
        )
        for callback in callbacks:
            try:
                callback()
            except Exception:  # noqa: BLE001 - e.g. the engine already stopped; nothing left to tell
                logger.debug("background compile: a done callback failed", exc_info=True)
