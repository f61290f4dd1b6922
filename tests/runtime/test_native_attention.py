"""The native step's attention (runtime/native/hd_attention.h), driven through a probe library built from
tests/runtime/native_attention_probe.c exactly as the runtime builds its kernels: an extend's tiled attention
(HDStep.chain: query rows as vector lanes, the span's K/V gathered once) and the decode's per-head units, each
against a float64 reference over scattered pool slots (causal spans, GQA groups, the output gate, head sizes off
the 8-float vectors and the 6-key / 6-column tiles), bit-identical under 1, 2 and 3 threads, and the plain-C
build (no AVX2) within float32 rounding of the reference."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from runtime.native import build
from runtime.native.amx import bf16_tiles

PROBE = Path(__file__).with_name("native_attention_probe.c")
_F = ctypes.POINTER(ctypes.c_float)
_I = ctypes.POINTER(ctypes.c_int64)
_I64 = ctypes.c_int64

pytestmark = pytest.mark.skipif(build.find_compiler() is None, reason="needs a C compiler (CI installs gcc)")

# (query heads, KV heads, head size, rows, cached prefix): the peer model's warm extend; a fresh sequence; a real
# Qwen3-Next head size; odd sizes (hd not a multiple of 8, rows not of 16); a group of one.
# The tile path (a bf16 model's extend): real Qwen3-Next's warm extends (48 or 64 rows), a 256 head size, few rows.
TILES = [(8, 2, 128, 48, 2000), (8, 2, 128, 64, 1984), (16, 2, 256, 5, 37), (4, 4, 64, 17, 100)]
CHAIN = [(4, 2, 64, 48, 2000), (4, 2, 64, 2, 0), (16, 2, 256, 5, 37), (3, 1, 20, 7, 13), (4, 4, 16, 17, 100)]


def _load(tmp: Path, name: str, flags: tuple[str, ...] = build.DEFAULT_FLAGS) -> ctypes.CDLL:
    lib = build.load(f"{name}_{tmp.name}", PROBE, flags).lib
    lib.probe_attend.argtypes = [_I64, _I64, _I64, _I64, ctypes.c_double, _I64, _I64, _I, _I, _F, _F, _F, _F]
    lib.probe_attend.restype = ctypes.c_int
    lib.probe_set_threads.argtypes = [ctypes.c_int]
    lib.probe_attend_as.argtypes = [*lib.probe_attend.argtypes, _I64]
    lib.probe_attend_as.restype = ctypes.c_int
    return lib


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ctypes.CDLL, ctypes.CDLL]]:
    with pytest.MonkeyPatch.context() as mp:
        tmp = tmp_path_factory.mktemp("attention")
        mp.setenv(build.CACHE_ENV, str(tmp / "cache"))
        mp.delenv(build.DISABLE_ENV, raising=False)
        build.forget_loaded()
        plain_flags = tuple(f for f in build.DEFAULT_FLAGS if f != "-march=native") + ("-mno-avx2", "-mno-fma")
        yield _load(tmp, "attention_probe"), _load(tmp, "attention_probe_plain", plain_flags)
        build.forget_loaded()


def _case(nh: int, nkv: int, hd: int, rows: int, prefix: int, chain: bool, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    slots = 3 * (prefix + rows) + 11
    if chain:
        flat = rng.permutation(slots)[: prefix + rows]  # scattered pages, as a pool hands them out
        offsets = np.arange(prefix, prefix + rows + 1)
        offsets[0] = 0
    else:  # `rows` sequences of 1..prefix+1 tokens each
        lens = rng.integers(1, prefix + 2, rows)
        offsets = np.concatenate([[0], np.cumsum(lens)])
        flat = rng.integers(0, slots, int(offsets[-1]))
    return {
        "k": rng.standard_normal((slots, nkv, hd)).astype(np.float32),
        "v": rng.standard_normal((slots, nkv, hd)).astype(np.float32),
        "q": rng.standard_normal((rows, nh * hd * 2)).astype(np.float32),
        "flat": flat.astype(np.int64),
        "offsets": offsets.astype(np.int64),
    }


def _run(
    lib: ctypes.CDLL, c: dict[str, np.ndarray], nh: int, nkv: int, hd: int, gate: bool, chain: bool, bf16: bool = False
) -> np.ndarray:
    """`bf16`: the layer's weights are bf16 (HD_BF16), so an extend takes the AMX tiles where the host has them."""
    rows = c["offsets"].shape[0] - 1
    q = np.ascontiguousarray(c["q"] if gate else c["q"][:, : nh * hd])
    o = np.full((rows, nh * hd), np.nan, dtype=np.float32)
    k, v = c["k"].copy(), c["v"].copy()
    code = lib.probe_attend_as(
        nh, nkv, hd, int(gate), hd**-0.5, int(chain), rows, c["offsets"].ctypes.data_as(_I),
        c["flat"].ctypes.data_as(_I), k.ctypes.data_as(_F), v.ctypes.data_as(_F), q.ctypes.data_as(_F),
        o.ctypes.data_as(_F), int(bf16),
    )  # fmt: skip
    assert code == 0
    assert np.array_equal(k, c["k"]) and np.array_equal(v, c["v"]), "attention wrote to the pools"
    return o


def _reference(c: dict[str, np.ndarray], nh: int, nkv: int, hd: int, gate: bool, chain: bool) -> np.ndarray:
    rows, group = c["offsets"].shape[0] - 1, nh // nkv
    stride = 2 * hd if gate else hd
    q = c["q"].astype(np.float64) if gate else c["q"][:, : nh * hd].astype(np.float64)
    out = np.zeros((rows, nh * hd))
    for b in range(rows):
        lo = 0 if chain else c["offsets"][b]
        span = c["flat"][lo : c["offsets"][b + 1]]
        for h in range(nh):
            qh = q[b, h * stride : h * stride + hd]
            keys = c["k"][span, h // group].astype(np.float64)
            s = keys @ qh * hd**-0.5
            p = np.exp(s - s.max())
            o = (p / p.sum()) @ c["v"][span, h // group].astype(np.float64)
            if gate:
                o = o / (1 + np.exp(-q[b, h * stride + hd : h * stride + 2 * hd]))
            out[b, h * hd : (h + 1) * hd] = o
    return out


def _on_1_2_3_threads(lib: ctypes.CDLL, run: Callable[[], np.ndarray]) -> list[np.ndarray]:
    """run()'s result under 1, 2 and 3 worker threads (the probe's pool back at 1 after)."""
    outs = []
    try:
        for threads in (1, 2, 3):
            lib.probe_set_threads(threads)
            outs.append(run())
    finally:
        lib.probe_set_threads(1)
    return outs


@pytest.mark.parametrize("shape", CHAIN, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("gate", [True, False])
def test_extend_attention_matches_float64_and_is_thread_independent(
    libs: tuple[ctypes.CDLL, ctypes.CDLL], shape: tuple[int, int, int, int, int], gate: bool
) -> None:
    lib, _ = libs
    nh, nkv, hd, rows, prefix = shape
    c = _case(nh, nkv, hd, rows, prefix, True, seed=sum(shape))
    ref = _reference(c, nh, nkv, hd, gate, True)
    outs = _on_1_2_3_threads(lib, lambda: _run(lib, c, nh, nkv, hd, gate, True))
    np.testing.assert_allclose(outs[0], ref, rtol=2e-4, atol=2e-5)
    assert all(np.array_equal(outs[0], o) for o in outs[1:]), "a row's result depends on the thread count"


@pytest.mark.parametrize("shape", [(4, 2, 64, 8, 300), (3, 1, 20, 5, 40)], ids=lambda s: "x".join(map(str, s)))
def test_decode_attention_matches_float64(libs: tuple[ctypes.CDLL, ctypes.CDLL], shape: tuple[int, ...]) -> None:
    lib, _ = libs
    nh, nkv, hd, rows, longest = shape
    c = _case(nh, nkv, hd, rows, longest, False, seed=7)
    np.testing.assert_allclose(
        _run(lib, c, nh, nkv, hd, True, False), _reference(c, nh, nkv, hd, True, False), rtol=2e-4, atol=2e-5
    )


@pytest.mark.parametrize("shape", CHAIN[:4], ids=lambda s: "x".join(map(str, s)))
def test_plain_c_extend_attention_matches_float64(
    libs: tuple[ctypes.CDLL, ctypes.CDLL], shape: tuple[int, int, int, int, int]
) -> None:
    _, plain = libs
    nh, nkv, hd, rows, prefix = shape
    c = _case(nh, nkv, hd, rows, prefix, True, seed=3)
    np.testing.assert_allclose(
        _run(plain, c, nh, nkv, hd, True, True), _reference(c, nh, nkv, hd, True, True), rtol=2e-4, atol=2e-5
    )


@pytest.mark.parametrize("runs", [[300, 48], [64, 40, 200, 17], [5]], ids=lambda r: "+".join(map(str, r)))
def test_extend_reads_contiguous_runs_in_place_exactly_as_gathered(
    libs: tuple[ctypes.CDLL, ctypes.CDLL], runs: list[int]
) -> None:
    """A span of a few runs of consecutive slots (a prefix hit: the cached pages, then the new tokens') is read
    from the pool in place; the same rows scattered over the pool are gathered first. Same rows, same result, to
    the bit (each score and output is the same chain of FMAs either way)."""
    lib, _ = libs
    nh, nkv, hd, rows = 4, 2, 64, runs[-1] if len(runs) > 1 else 3
    c = _case(nh, nkv, hd, rows, sum(runs) - rows, True, seed=len(runs))
    slots = c["k"].shape[0]
    starts = np.cumsum([0, *[n + 7 for n in runs[:-1]]])  # runs in pool order, gaps of 7 free slots between
    flat = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, runs, strict=True)]).astype(np.int64)
    assert flat[-1] < slots
    rng = np.random.default_rng(1)
    scattered = rng.permutation(slots)[: flat.size].astype(np.int64)
    k, v = c["k"].copy(), c["v"].copy()
    in_place = {**c, "flat": flat}
    gathered = {**c, "flat": scattered, "k": k, "v": v}
    gathered["k"][scattered], gathered["v"][scattered] = c["k"][flat], c["v"][flat]
    a = _run(lib, in_place, nh, nkv, hd, True, True)
    b = _run(lib, gathered, nh, nkv, hd, True, True)
    assert np.array_equal(a, b)
    np.testing.assert_allclose(a, _reference(in_place, nh, nkv, hd, True, True), rtol=2e-4, atol=2e-5)


@pytest.mark.skipif(not bf16_tiles(), reason="needs a host whose kernels run bf16 on AMX tiles")
@pytest.mark.parametrize("shape", TILES, ids=lambda s: "x".join(map(str, s)))
def test_bf16_extend_attention_on_tiles_is_bf16_close_and_thread_independent(
    libs: tuple[ctypes.CDLL, ctypes.CDLL], shape: tuple[int, int, int, int, int]
) -> None:
    """A bf16 model's extend (real Qwen3-Next's warm request shapes first) takes the AMX tiles: within bf16
    rounding of the float64 reference, visibly not the fp32 tiles' result, and bit-identical under 1, 2 and 3
    threads."""
    lib, _ = libs
    nh, nkv, hd, rows, prefix = shape
    c = _case(nh, nkv, hd, rows, prefix, True, seed=sum(shape))
    ref = _reference(c, nh, nkv, hd, True, True)
    outs = _on_1_2_3_threads(lib, lambda: _run(lib, c, nh, nkv, hd, True, True, bf16=True))
    # bf16 keeps 8 bits of mantissa: q, k, P and v each rounded once (relative 2^-9), the sums in fp32
    np.testing.assert_allclose(outs[0], ref, rtol=0, atol=3e-2 * np.abs(ref).max())
    assert np.abs(outs[0] - ref).mean() < 6e-3 * np.abs(ref).mean()
    assert not np.array_equal(outs[0], _run(lib, c, nh, nkv, hd, True, True)), "the bf16 layer took the fp32 tiles"
    assert all(np.array_equal(outs[0], o) for o in outs[1:]), "a row's result depends on the thread count"
