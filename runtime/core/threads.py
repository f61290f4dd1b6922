"""Running a block of torch work on a given number of intra-op threads (the engine's serial decode, the
compiled decode's chosen count, the delta rule's small chunk loop)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def intra_op_threads(threads: int) -> Iterator[None]:
    """Run the block on `threads` torch intra-op threads and restore the caller's count afterwards. Nothing is
    set when the count already matches: `torch.set_num_threads` also reconfigures OpenMP and MKL. Inside a
    torch.compile trace it sets nothing: a compiled graph's kernels have their thread count built in."""
    if torch.compiler.is_compiling():
        yield
        return
    before = torch.get_num_threads()
    if before == threads:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
