"""Which path a forward takes for its device: the accelerator path (device-resident MoE dispatch, no native C
kernels, pinned non-blocking uploads) on CUDA, the CPU path (host-driven MoE dispatch, the C kernels) on the CPU.

`rehearse_accelerator_path()` makes CPU forwards take the accelerator path, so that what a GPU would run can be
tested (readbacks counted, outputs compared) on a host without one: tests and `benchmarks/gpu_check.py --device cpu`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

_rehearsal = [False]


def accelerator_path(device: torch.device) -> bool:
    """Whether a forward on `device` takes the accelerator path."""
    return device.type != "cpu" or _rehearsal[0]


def on_accelerator_path(t: torch.Tensor) -> bool:
    """`accelerator_path(t.device)` for a tensor, at a sixth of its cost (asked once per MoE layer per step)."""
    return _rehearsal[0] or not t.is_cpu


@contextmanager
def rehearse_accelerator_path() -> Iterator[None]:
    """CPU forwards inside take the accelerator path (process-wide: the engine thread included)."""
    before = _rehearsal[0]
    _rehearsal[0] = True
    try:
        yield
    finally:
        _rehearsal[0] = before


def upload(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`. To CUDA from pinned memory without blocking the host: a pageable copy waits for
    the stream, a pinned one is queued (the caching host allocator keeps the pinned block until the copy is done).
    On the CPU, `t` itself (pinning needs a CUDA driver)."""
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
