"""The bundled runtime: a hybrid-model engine (torch) behind SGLang's HTTP API. Started as `python -m runtime`."""

import ctypes
import os

# OpenMP workers that spin without bound between parallel regions wreck a shared or oversubscribed CPU: measured
# on a busy 2-core host, a 2048-token prefill on 2 threads took 33 s spinning vs 1.6 s sleeping (1 thread: 1.8 s).
# Workers that sleep at once pay a futex wake-up per region instead, which made two threads lose to one below
# ~1000 prompt tokens. A short spin (GOMP_SPINCOUNT 10000, then sleep) keeps a worker awake across the
# back-to-back regions of one forward and asleep between steps: cold TTFT on the demo model, 2 threads, quiet
# host, sleep-at-once vs short spin: 2048 tokens 321 vs 267 ms, 128 tokens 65 vs 29 ms; compiled batch-8 decode
# step 19.3 vs 6.8 ms; with two busy loops on the 2 cores, 2048 tokens 768 vs 690 ms (benchmarks/
# serial_threshold.py, docs/performance.md). libgomp reads these once, when torch loads, so they only take
# effect when `runtime` is imported first (as in `python -m runtime`); an explicit OMP_WAIT_POLICY or
# GOMP_SPINCOUNT in the environment wins (OMP_WAIT_POLICY=PASSIVE alone: no spin at all).
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "10000"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def _keep_freed_memory() -> None:
    """A forward's intermediates (1-30 MB each for a long prefill) are above glibc's default mmap threshold, so
    each one was a fresh mmap whose pages fault in zeroed, then an munmap: ~25% of a 2048-token prefill's CPU
    time on one thread (700 -> 530 ms). Served from the heap and not trimmed, freed blocks are reused by the
    next forward instead; the cost is that the heap keeps its high-water mark. glibc only; an explicit
    MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ in the environment wins."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols, libc's included
    except (OSError, AttributeError):
        return  # not glibc (musl, macOS): nothing to tune
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # glibc's ceiling for this parameter on 64-bit
    mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    if "MALLOC_ARENA_MAX" not in os.environ:
        # The server's forwards run on the engine thread and OpenMP workers, which glibc gives arenas of their
        # own: heaps of at most 64 MB that a long prefill's intermediates kept leaving and re-faulting (served
        # real-size Nemotron-H, 2048-token cold prompt, slots prefaulted: 213-230k minor faults, 8-132k with one).
        mallopt(_M_ARENA_MAX, 1)
    if "MALLOC_MMAP_MAX_" not in os.environ:
        # Blocks of 32 MB and more (a 2048-token prefill's widest intermediates, depending on how its chunks
        # fall) were still fresh mmaps each time: from the heap instead, which keeps them (same prompt: 45-2k
        # faults; idle RSS unchanged, the pools' untouched pages stay unbacked).
        mallopt(_M_MMAP_MAX, 0)


_keep_freed_memory()
