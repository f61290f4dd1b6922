"""Denormal floats flushed to zero on the engine's threads.

Denormals (magnitudes below 1.2e-38) cost a microcode assist per operation on Intel cores: a [4, 32, 64] x
[4, 64, 64] baddbmm took 1140 us with denormal inputs vs 8 us without (Xeon, one thread). The delta rule's
decayed states and pair decays of fast-forgetting heads are full of them: a cold 2048-token prefill of the peer
model took 908 ms with them and 220 ms without (benchmarks/prefill_cpu.py). A value that small changes no sum it
joins (fp32 keeps ~7 digits next to the values of order 1 it is added to), and decays only shrink it further.

FTZ/DAZ lives in each thread's SSE control register, and a thread starts with its creator's: set on the engine
thread before its first parallel region, it holds for the OpenMP workers that thread then starts. It is set on
the engine thread only, never process-wide, so the caller's own threads keep IEEE arithmetic.
"""

from __future__ import annotations

import os

import torch

ENV = "RUNTIME_FLUSH_DENORMALS"  # "0": keep IEEE denormals on the engine thread too


def flush_denormals_on_this_thread() -> bool:
    """FTZ/DAZ on the calling thread (and the threads it starts from now on). False when turned off by the
    environment or unsupported by the CPU (torch then leaves the mode unchanged)."""
    if os.environ.get(ENV, "1").strip() == "0":
        return False
    return bool(torch.set_flush_denormal(True))
