"""The C kernels' worker pool (runtime/native/parallel.h), driven through a probe library built from
tests/runtime/native_parallel_probe.c exactly as the runtime builds its kernels: how [0, n) is split, that one
thread never starts a worker, that idle workers go to sleep, that two callers at once and a nested call stay
correct, and that a worker computes under the caller's flush-to-zero setting."""

from __future__ import annotations

import ctypes
import platform
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.native import build

PROBE = Path(__file__).with_name("native_parallel_probe.c")
_I64P = ctypes.POINTER(ctypes.c_int64)

pytestmark = pytest.mark.skipif(build.find_compiler() is None, reason="needs a C compiler (CI installs gcc)")


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    # A fresh library per test (its own cache dir): each test starts with a pool that never ran.
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(build.DISABLE_ENV, raising=False)
    build.forget_loaded()
    lib = build.load(f"parallel_probe_{tmp_path.name}", PROBE).lib
    lib.probe_fill.argtypes = [ctypes.c_int64, ctypes.c_int64, _I64P, _I64P, _I64P]
    lib.probe_nested.argtypes = [ctypes.c_int64, _I64P, _I64P, _I64P]
    lib.probe_empty_regions.argtypes = [ctypes.c_int64]
    lib.probe_set_spin_us.argtypes = [ctypes.c_int64]
    yield lib
    build.forget_loaded()


def _fill(lib: ctypes.CDLL, n: int, grain: int, *, nested: bool = False) -> tuple[list[int], list[int], list[int]]:
    hits, begins, threads = ((ctypes.c_int64 * max(n, 1))() for _ in range(3))
    if nested:
        lib.probe_nested(n, hits, begins, threads)
    else:
        lib.probe_fill(n, grain, hits, begins, threads)
    return list(hits)[:n], list(begins)[:n], list(threads)[:n]


@pytest.mark.parametrize(
    ("threads", "n", "grain", "parts"),
    [(2, 100, 1, 2), (2, 100, 60, 1), (2, 7, 3, 2), (3, 10, 1, 3), (3, 10, 4, 2), (4, 3, 1, 3), (2, 0, 1, 0)],
)
def test_splits_into_contiguous_parts_of_at_least_grain(
    probe: ctypes.CDLL, threads: int, n: int, grain: int, parts: int
) -> None:
    probe.probe_set_threads(threads)
    assert probe.probe_threads() == threads
    for _ in range(3):  # the first call starts the workers; the later ones reuse them
        hits, begins, owners = _fill(probe, n, grain)
        assert hits == [1] * n  # every item exactly once
        starts = sorted(set(begins))
        assert len(starts) == parts
        bounds = [*starts, n]
        assert all(b - a >= grain for a, b in zip(bounds, bounds[1:], strict=False))
        # Contiguous: each part's items carry its begin, in order.
        assert begins == sorted(begins)
        # Each part on one thread; never more threads than parts (the caller runs a part a worker did not claim).
        assert 1 <= len(set(owners)) <= max(parts, 1) or n == 0
        for start in starts:
            assert len({o for o, b in zip(owners, begins, strict=True) if b == start}) == 1


def test_one_thread_runs_inline_and_starts_no_worker(probe: ctypes.CDLL) -> None:
    probe.probe_set_threads(1)
    hits, begins, owners = _fill(probe, 1000, 1)
    assert hits == [1] * 1000 and set(begins) == {0} and len(set(owners)) == 1
    assert probe.probe_started() == 1  # the caller alone


def test_idle_workers_go_to_sleep(probe: ctypes.CDLL) -> None:
    probe.probe_set_threads(3)
    probe.probe_set_spin_us(1000)
    _fill(probe, 30, 1)
    assert probe.probe_started() == 3
    deadline = time.monotonic() + 60.0  # they sleep after 1 ms of spinning: a loaded host may delay that long
    while probe.probe_sleeping() < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert probe.probe_sleeping() == 2
    # And they wake for the next region.
    hits, _, _ = _fill(probe, 30, 1)
    assert hits == [1] * 30


def test_two_callers_at_once_and_a_nested_call_stay_correct(probe: ctypes.CDLL) -> None:
    probe.probe_set_threads(2)
    errors: list[str] = []

    def caller(n: int) -> None:
        for _ in range(300):
            hits, _, _ = _fill(probe, n, 1)
            if hits != [1] * n:
                errors.append(f"n={n}: {hits}")
                return

    workers = [threading.Thread(target=caller, args=(n,)) for n in (64, 97)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in workers), "a caller hung"
    assert errors == []
    hits, begins, owners = _fill(probe, 50, 1, nested=True)
    assert hits == [1] * 50
    # The outer split in two parts; each inner loop ran inline, as one part, on its outer part's thread.
    assert len(set(owners)) <= 2 and set(begins) == {0}


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="MXCSR is x86's")
def test_workers_compute_under_the_callers_flush_to_zero(probe: ctypes.CDLL) -> None:
    probe.probe_set_threads(2)
    probe.probe_empty_regions(3)  # the worker exists, started without flush-to-zero
    out = (ctypes.c_float * 64)()
    probe.probe_flush_to_zero(64, out)
    assert list(out) == [0.0] * 64  # 1e-20 * 1e-20 flushed on both threads, not a denormal on one
