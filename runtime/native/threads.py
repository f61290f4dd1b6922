"""How many threads the runtime may use: a count pinned by an environment variable, and the cores this process may
run on. One place for the engine's thread choosers (runtime/engine/decode_threads.py) and the C kernels' worker
pools (runtime/native/*)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

CGROUP_ROOT = Path("/sys/fs/cgroup")


def pinned_from_env(name: str) -> int | None:
    """A thread count pinned by the environment variable `name` ("1", "2", ...), None when unset; ValueError
    naming the variable for anything else."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name}={raw!r}: expected a positive thread count (e.g. 1 or 2), or unset it")
    return int(raw)


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> int | None:
    """The CPUs a cgroup quota allows (`docker --cpus=1.5` → 2), None without one. cgroup v2's `cpu.max`
    ("quota period" or "max period"), else v1's `cpu/cpu.cfs_quota_us` and `cpu.cfs_period_us` (-1: none)."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
        return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return max(1, math.ceil(quota_us / period_us)) if quota_us > 0 and period_us > 0 else None


def usable_threads() -> int:
    """The process's torch thread count (--num-threads), and no more than the cores this process may run on: its
    CPU affinity and its cgroup's quota (a worker spinning past the quota gets the whole process throttled)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return max(1, min(torch.get_num_threads(), cores, limit or cores))
