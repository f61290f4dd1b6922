"""Whether this host's native kernels run bf16 weights on AMX tiles (runtime/native/amx_gemm.h): a tiny library
built with the kernels' own flags answers, so it takes the path they take. On such a host a bf16 matrix's rows
round the activations to bf16 (the header states the changed contract); fp32 weights never take the tiles."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runtime.native import build
from runtime.native.build import NativeLibrary

SOURCE = Path(__file__).with_name("amx_probe.c")


@functools.cache
def bf16_tiles() -> bool:
    """True when bf16 GEMMs of the dot form take AMX tiles here (False without a compiler or native kernels)."""
    try:
        lib = build.load("amx_probe", SOURCE).lib
    except build.NativeUnavailable:
        return False
    return bool(lib.hd_bf16_tiles())


def set_bf16_tiles(library: NativeLibrary, on: bool) -> None:
    """Off: `library`'s bf16 GEMMs keep the FMA form, the fp32 kernel's bits on the rounded weights (tests that
    assert those bits; an A/B of the two); on: the tiles again where the host grants them."""
    fn = library.lib.hd_set_bf16_tiles
    fn.argtypes = [ctypes.c_int]
    fn.restype = None
    fn(1 if on else 0)


@contextmanager
def fma_form(library: NativeLibrary) -> Iterator[None]:
    """`library`'s bf16 GEMMs in the FMA form within the block, the tiles again after it."""
    set_bf16_tiles(library, False)
    try:
        yield
    finally:
        set_bf16_tiles(library, True)
