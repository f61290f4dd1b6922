"""The bundled runtime: a hybrid-model engine (torch) behind SGLang's HTTP API. Started as `python -m runtime`."""

import ctypes
import os

# OpenMP workers that spin between parallel regions wreck a shared or oversubscribed CPU: measured on a busy
# 2-core host, a 2048-token prefill on 2 threads took 33 s spinning vs 1.6 s sleeping (1 thread: 1.8 s).
# libgomp reads this once, when torch loads, so it only takes effect when `runtime` is imported first (as in
# `python -m runtime`); an explicit OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3


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


_keep_freed_memory()
