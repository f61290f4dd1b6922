"""Counts a step's device-to-host readbacks (host syncs), on a GPU or as a rehearsal on the CPU.

On CUDA a readback is any host read of a CUDA tensor's values: `aten._local_scalar_dense` (`.item()`, `int()`,
`float()`, `bool()`), `.tolist()`, `.numpy()`, `.cpu()`, a `copy_` into a CPU tensor, and the ops whose output size
depends on the values (`nonzero`, boolean-mask indexing, `masked_select`, `unique`, `bincount`,
`repeat_interleave` without `output_size`, `equal`), which make CUDA wait for the values before it can allocate.

On the CPU every tensor is host memory, so "device" is emulated: the tensors `device_tensors` names (the model's
parameters and buffers, the KV/state pools) are device tensors, so is every op output computed from one
(data flow, tracked per tensor object), and so is what `.to(device)` or a factory with an explicit `device=`
makes from host data (an upload: `.to(device)` of a host tensor returns a fresh copy here, as CUDA would, and is
counted in `uploads`). A readback is then one of the reads above applied to a device tensor. Host tensors the
engine builds from Python lists (ids, positions, slots) and reads itself are not readbacks, as on a GPU.

`.tolist()` and `.numpy()` never reach the dispatcher (they read memory in C++), so they are seen one level up,
by a `TorchFunctionMode`; everything else by a `TorchDispatchMode`. A `.tolist()` is one readback however many
elements it returns, as it is one copy on a GPU.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten

# Ops whose output size depends on tensor values: on CUDA the host waits for the values.
_VALUE_SIZED = {
    aten.nonzero.default,
    aten.masked_select.default,
    aten.bincount.default,
    aten.repeat_interleave.Tensor,
    aten._unique2.default,  # noqa: SLF001 - torch's op namespace
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.equal.default,
}
_FACTORIES: set[Callable[..., Any]] = {
    torch.tensor,
    torch.as_tensor,
    torch.zeros,
    torch.ones,
    torch.empty,
    torch.full,
    torch.arange,
    torch.randn,
    torch.rand,
}
_HOST_READS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu}


@dataclass
class ReadbackCount:
    """What one counted region did: `readbacks` by kind (the total is `total`), `uploads` of host tensors."""

    by_kind: Counter[str] = field(default_factory=Counter)
    uploads: int = 0

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())


class _Tracker:
    def __init__(self, emulate: bool) -> None:
        self.emulate = emulate
        # id -> weak reference: a WeakSet compares tensors with ==, which is elementwise for tensors.
        self.device: dict[int, weakref.ref[torch.Tensor]] = {}
        self.count = ReadbackCount()

    def is_device(self, t: object) -> bool:
        if not isinstance(t, torch.Tensor):
            return False
        if not self.emulate:
            return t.device.type != "cpu"
        ref = self.device.get(id(t))
        return ref is not None and ref() is t

    def any_device(self, tree: object) -> bool:
        return any(self.is_device(t) for t in tree_flatten(tree)[0])

    def mark(self, tree: object) -> None:
        if self.emulate:
            for t in tree_flatten(tree)[0]:
                if isinstance(t, torch.Tensor):
                    self.device[id(t)] = weakref.ref(t)


class _FunctionLevel(TorchFunctionMode):
    def __init__(self, tracker: _Tracker) -> None:
        super().__init__()
        self.tracker = tracker

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        tr = self.tracker
        if func in _HOST_READS:
            if tr.is_device(args[0]):
                tr.count.by_kind[func.__name__] += 1
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if not tr.emulate:
            return out
        if func is torch.Tensor.to and _names_device(args[1:], kwargs) and not tr.is_device(args[0]):
            if out is args[0]:  # CPU to "the device" is a no-op here; on a GPU it is a new tensor
                out = out.clone()
            tr.count.uploads += 1
            tr.mark(out)
        elif func in _FACTORIES and kwargs.get("device") is not None:
            tr.count.uploads += func in (torch.tensor, torch.as_tensor)
            tr.mark(out)
        return out


class _DispatchLevel(TorchDispatchMode):
    def __init__(self, tracker: _Tracker) -> None:
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        tr = self.tracker
        from_device = tr.any_device((args, kwargs))
        if from_device:
            if func is aten._local_scalar_dense.default or func in _VALUE_SIZED:  # noqa: SLF001 - an aten op
                tr.count.by_kind[str(func.overloadpacket.__name__)] += 1
            elif func is aten.index.Tensor and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]
            ):
                tr.count.by_kind["bool_index"] += 1
            elif func is aten.copy_.default and tr.is_device(args[1]) and not tr.is_device(args[0]):
                tr.count.by_kind["copy_to_host"] += 1
                return func(*args, **kwargs)  # the destination stays host memory
        out = func(*args, **kwargs)
        if from_device:
            tr.mark(out)
        return out


def _names_device(args: Iterable[object], kwargs: dict[str, object]) -> bool:
    """Whether a `Tensor.to` call names a device (not only a dtype)."""
    return kwargs.get("device") is not None or any(isinstance(a, (torch.device, str)) for a in args)


@contextmanager
def count_readbacks(
    device_tensors: Iterable[torch.Tensor] = (), *, emulate: bool | None = None
) -> Iterator[ReadbackCount]:
    """Counts the readbacks of the code run inside. `emulate` (default: all `device_tensors` are on the CPU):
    treat `device_tensors` and what is computed from them as device memory (see the module docstring)."""
    tensors = list(device_tensors)
    if emulate is None:
        emulate = all(t.device.type == "cpu" for t in tensors)
    tracker = _Tracker(emulate)
    tracker.mark(tensors)
    with ExitStack() as stack:
        stack.enter_context(_FunctionLevel(tracker))
        stack.enter_context(_DispatchLevel(tracker))
        yield tracker.count


def model_device_tensors(model: torch.nn.Module, buffers: object) -> list[torch.Tensor]:
    """The model's parameters and buffers and every tensor of the pools (`PoolBuffers`, any nesting)."""
    pools = [t for t in tree_flatten(list(vars(buffers).values()))[0] if isinstance(t, torch.Tensor)]
    return [*model.parameters(), *model.buffers(), *pools]
