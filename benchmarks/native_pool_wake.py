"""What a region of the C kernels' worker pool (runtime/native/parallel.h) costs: an empty two-part region with the
worker spinning (regions back to back, as inside a decode step), and after the worker went to sleep (the first
region of a step after an idle gap: a condvar wake-up), against the same call with one thread (inline).

    python benchmarks/native_pool_wake.py [--rounds 2000] [--sleeps 200]

Built from tests/runtime/native_parallel_probe.c, the pool test's probe. Reports medians in microseconds and the
load average (a shared host: a descheduled worker shows up as a long tail, so p90 too).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time
from pathlib import Path

from runtime.native import build

PROBE = Path(__file__).resolve().parents[1] / "tests" / "runtime" / "native_parallel_probe.c"


def _per_region_us(lib: ctypes.CDLL, rounds: int) -> float:
    start = time.perf_counter_ns()
    lib.probe_empty_regions(rounds)
    return (time.perf_counter_ns() - start) / rounds / 1000


def _after_sleep_us(lib: ctypes.CDLL, sleeps: int) -> list[float]:
    out = []
    for _ in range(sleeps):
        time.sleep(0.003)  # > the spin: the worker is asleep
        start = time.perf_counter_ns()
        lib.probe_empty_regions(1)
        out.append((time.perf_counter_ns() - start) / 1000)
    return out


def _busy(lib: ctypes.CDLL, iters: int, *, sleep: float) -> tuple[float, bool]:
    """One region of two ~equal parts: (wall us, whether the worker ran one)."""
    owners, sink = (ctypes.c_int64 * 2)(), (ctypes.c_double * 2)()
    if sleep:
        time.sleep(sleep)
    start = time.perf_counter_ns()
    lib.probe_busy(2, iters, owners, sink)
    return (time.perf_counter_ns() - start) / 1000, owners[0] != owners[1]


def _busy_report(lib: ctypes.CDLL, label: str, iters: int, sleep: float, n: int) -> None:
    runs = [_busy(lib, iters, sleep=sleep) for _ in range(n)]
    wall = statistics.median(r[0] for r in runs)
    shared = sum(r[1] for r in runs) / n
    print(f"{label}: {wall:.1f} us a region, the worker ran a part in {shared:.0%} of regions")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--sleeps", type=int, default=200)
    ap.add_argument("--busy-iters", type=int, default=20000, help="work a part in the busy regions (~4 ns each)")
    a = ap.parse_args()
    lib = build.load("parallel_probe", PROBE).lib
    lib.probe_empty_regions.argtypes = [ctypes.c_int64]
    lib.probe_set_spin_us.argtypes = [ctypes.c_int64]
    print(f"load average {os.getloadavg()}")
    lib.probe_set_threads(1)
    inline = [_per_region_us(lib, a.rounds) for _ in range(5)]
    inline_call = statistics.median(_after_sleep_us(lib, a.sleeps))
    lib.probe_set_threads(2)
    lib.probe_set_spin_us(2000)
    hot = [_per_region_us(lib, a.rounds) for _ in range(5)]
    woken = sorted(_after_sleep_us(lib, a.sleeps))
    print(f"1 thread (inline): {statistics.median(inline):.3f} us a region; one ctypes call {inline_call:.1f} us")
    print(f"2 threads, worker spinning: {statistics.median(hot):.3f} us a region (min {min(hot):.3f})")
    print(
        f"2 threads, worker asleep: {statistics.median(woken):.1f} us (p90 {woken[int(len(woken) * 0.9)]:.1f}) "
        "for the call, ctypes included"
    )
    lib.probe_busy.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    iters = a.busy_iters
    lib.probe_set_threads(1)
    _busy_report(lib, f"1 thread, 2 x {iters} iterations", iters, 0.0, 50)
    lib.probe_set_threads(2)
    _busy_report(lib, "2 threads, back to back", iters, 0.0, 200)
    _busy_report(lib, "2 threads, after 3 ms idle (worker asleep)", iters, 0.003, 100)
    lib.probe_set_spin_us(300)
    _busy_report(lib, "2 threads, after 0.25 ms idle (a gap between steps; spin 300 us)", iters, 0.00025, 100)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
