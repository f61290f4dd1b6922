"""How many cores the rest of the host left this process during a forward: the host's busy CPU time over the step
(/proc/stat) less this process's own (process CPU clock), out of all the host's cores.

Why: a prefill's two-thread choice is right exactly when a second core is free (quiet 2-core host, 2048-token
prefill of the peer model: ~215 ms on two threads vs ~390 on one; another process holding a core: ~660 vs ~400,
every OpenMP region waiting on a descheduled worker). A step on one thread says nothing about the other count in
its wall time, which barely moves with the load, so a chooser that learnt "one thread" on a busy moment kept it
until its next periodic probe, many prefills later. The host's idle time during that step does say it.

/proc/stat counts in clock ticks (10 ms on Linux), so a step shorter than MIN_WALL_S gives no reading. Inside a
container /proc/stat is the whole machine's, a CPU quota unseen: a reading is a hint that starts a measured
probe, never the choice itself.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
MIN_WALL_S = 0.05  # five ticks of a core: shorter steps give no reading
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
_IDLE_FIELDS = (3, 4)  # idle, iowait (after the "cpu" label)


@dataclass(frozen=True)
class CpuClocks:
    host_busy_s: float  # all cores' non-idle time since boot
    own_s: float  # this process's CPU time, all its threads
    wall_s: float


def parse_busy_seconds(stat_text: str, tick_s: float = _TICK_S) -> float:
    """All cores' non-idle seconds from /proc/stat's first line (user nice system idle iowait irq softirq steal
    ...; guest time is already in user). Steal counts as busy: our vCPU did not run."""
    fields = stat_text.split("\n", 1)[0].split()
    if not fields or fields[0] != "cpu":
        raise ValueError("not a /proc/stat text")
    ticks = [int(v) for v in fields[1:9]]
    return (sum(ticks) - sum(ticks[i] for i in _IDLE_FIELDS)) * tick_s


def read_clocks(stat: Path = PROC_STAT) -> CpuClocks | None:
    """Now, or None where /proc/stat cannot be read (not Linux)."""
    try:
        busy = parse_busy_seconds(stat.read_text())
    except (OSError, ValueError):
        return None
    return CpuClocks(host_busy_s=busy, own_s=time.process_time(), wall_s=time.perf_counter())


def headroom(before: CpuClocks | None, after: CpuClocks | None, cores: int | None = None) -> float | None:
    """The cores left to this process between two readings: all of the host's less what other processes ran,
    averaged over the interval; None for no reading or an interval under MIN_WALL_S."""
    if before is None or after is None:
        return None
    wall = after.wall_s - before.wall_s
    if wall < MIN_WALL_S:
        return None
    others = (after.host_busy_s - before.host_busy_s) - (after.own_s - before.own_s)
    total = cores if cores is not None else (os.cpu_count() or 1)
    return min(float(total), max(0.0, total - others / wall))
