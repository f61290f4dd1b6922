"""How many threads the runtime may use: a count pinned by an environment variable, and the cores this process may
run on. One place for the engine's thread choosers (runtime/engine/decode_threads.py) and the C kernels' worker
pools (runtime/native/*)."""

from __future__ import annotations

import os

import torch


def pinned_from_env(name: str) -> int | None:
    """A thread count pinned by the environment variable `name` ("1", "2", ...), None when unset; ValueError
    naming the variable for anything else."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name}={raw!r}: expected a positive thread count (e.g. 1 or 2), or unset it")
    return int(raw)


def usable_threads() -> int:
    """The process's torch thread count (--num-threads), and no more than the cores this process may run on."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(torch.get_num_threads(), cores))
