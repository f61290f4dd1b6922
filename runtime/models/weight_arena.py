"""Host weights in one block of memory, backed by transparent huge pages where the kernel offers them.

A batch-1 decode step streams every weight it uses once, the routed experts picked token by token: hundreds of MB
per step, scattered over thousands of 4 KiB pages, and each page costs a TLB miss (a page walk) the hardware
prefetcher cannot hide. On 2 MiB pages the same bytes span 512x fewer translations. Linux backs an anonymous
mapping with huge pages only when asked (`/sys/kernel/mm/transparent_hugepage/enabled` = `madvise`, the common
default) and only for pages first touched after the request, so the request is made on the empty block, before
the checkpoint fills it. Where THP is `never`, or the platform has no madvise, the block is ordinary memory and
nothing else changes: parameters are plain tensors viewing it.
"""

from __future__ import annotations

import ctypes
import math
import sys
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
_ALIGN = 64  # a cache line: every parameter starts on one, as torch's own allocations do
_MADV_HUGEPAGE = 14  # linux/mman.h
_THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str:
    """The kernel's transparent-huge-page mode for anonymous memory ("always", "madvise", "never"), or "" where
    there is none (not Linux, or not exposed)."""
    try:
        text = _THP_MODE.read_text()
    except OSError:
        return ""
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else ""


def _advise_huge(start: int, length: int) -> bool:
    if not sys.platform.startswith("linux") or length <= 0:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise(start, length, _MADV_HUGEPAGE) == 0


class WeightArena:
    """One uint8 block holding tensors of the given sizes, each 64-byte aligned; `huge` says whether the kernel
    accepted the huge-page request for it (THP in `madvise` or `always` mode)."""

    def __init__(self, nbytes: list[int]) -> None:
        self.offsets: list[int] = []
        total = 0
        for n in nbytes:
            self.offsets.append(total)
            total += (n + _ALIGN - 1) // _ALIGN * _ALIGN
        # Room to start the tensors on a huge-page boundary: the aligned part is what the kernel can back.
        self.block = torch.empty(total + HUGE_PAGE, dtype=torch.uint8)
        base = self.block.data_ptr()
        start = (base + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
        self.shift = start - base
        self.nbytes = total
        huge_len = total // HUGE_PAGE * HUGE_PAGE
        self.huge = thp_mode() in ("madvise", "always") and _advise_huge(start, huge_len)

    def tensor(self, index: int, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """The `index`-th tensor's place in the block, as an (uninitialised) tensor of `shape` and `dtype`."""
        nbytes = math.prod(shape) * dtype.itemsize
        lo = self.shift + self.offsets[index]
        return self.block[lo : lo + nbytes].view(dtype).view(shape)
