"""What the compiled forwards (compiled_decode.py, compiled_extend.py) share: how a graph's inputs are
normalized, how warm-up leaves the pools as it found them, and how a compile failure is reported."""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch

from runtime.core.batch import PoolBuffers

logger = logging.getLogger("runtime.engine")


@dataclass
class CompileReport:
    """What warm-up did, for the start-up log line and for tests."""

    enabled: bool
    reason: str  # why it is off, "" when on
    graphs: int = 0
    elapsed_s: float = 0.0


def stays_eager(model_name: str, path: str, reason: str, elapsed_s: float) -> CompileReport:
    """The report of a compiled path (`path`: "decode", "extends") that stays eager, said once in the log."""
    logger.warning(
        "Torch compile: %s %s not compiled after %.1f s (%s); eager instead.",
        model_name,
        path,
        elapsed_s,
        reason[:300],
    )
    return CompileReport(enabled=False, reason=reason, elapsed_s=elapsed_s)


def run_compiled(compiled: Callable[..., torch.Tensor], *inputs: object, skip_guards: bool) -> torch.Tensor:
    """Call a compiled function, with only the guards that tell its graphs apart when `skip_guards` (safe while
    its inputs are normalized and nothing else shares its code objects: the callers' _INSTANCES checks)."""
    if skip_guards:
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            return compiled(*inputs)
    return compiled(*inputs)


def copy_function(fn: types.FunctionType, name: str) -> types.FunctionType:
    """`fn` over its own copy of the code object: dynamo keeps compiled graphs (and their guards) on the code
    object, so each copy holds only the graphs compiled through it."""
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def failure_reason(exc: BaseException) -> str:
    """The innermost error's type and first line: dynamo wraps the real one (BackendCompilerFailed and such)."""
    while True:
        inner = getattr(exc, "inner_exception", None) or exc.__cause__
        if not isinstance(inner, BaseException):
            break
        exc = inner
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def as_traced(t: torch.Tensor) -> torch.Tensor:
    """The input as the graphs were traced with: contiguous and an inference tensor. Dynamo guards on a
    tensor's dispatch keys, which differ between tensors made inside and outside inference mode (the scheduler
    makes some of a batch's tensors outside it)."""
    if t.is_inference() and t.is_contiguous():
        return t
    with torch.inference_mode():
        return t.contiguous().clone()


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process (each recompile adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def pools_traceable(buffers: PoolBuffers) -> str:
    """ "" when torch.compile can trace writes to the pool buffers, else why not."""
    tensors = (*buffers.k, *buffers.v, *buffers.conv, *buffers.ssm)
    if len({t.untyped_storage().data_ptr() for t in tensors}) < len(tensors):
        # aot_autograd refuses in-place writes to views of one storage with different bases.
        return (
            "the pool buffers are views of one storage (--enable-elastic-memory-pool); torch.compile cannot"
            " trace writes to them"
        )
    return ""


class restored:
    """Saves the token rows [0, tokens) of every KV buffer and the state slots [0, slots) of every state
    buffer, and puts them back on exit: warm-up must leave the pools as it found them."""

    def __init__(self, buffers: PoolBuffers, tokens: int, slots: int) -> None:
        self.saved = [(t, t[:tokens].clone()) for t in (*buffers.k, *buffers.v)]
        self.saved += [(t, t[:slots].clone()) for t in (*buffers.conv, *buffers.ssm)]

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        for t, rows in self.saved:
            t[: rows.shape[0]].copy_(rows)
