"""The native step's GEMMs (runtime/native/dot_gemm.h: the dot form `gemm`; wide_gemm.h: the broadcast form
`gemm_wide`, which row_gemm.h's `gemm_rows` takes from HD_WIDE_ROWS batch rows on), driven through a probe library
built from tests/runtime/native_gemm_probe.c exactly as the runtime builds its kernels: each form against a float64
reference, the dispatch on B (a decode batch keeps the dot form bit for bit), each form's promise that a row's
result never depends on the tile it falls in, the split of the rows or the thread count; bf16 weights giving the
same bits as fp32 weights rounded to bf16; and the AVX-512, AVX2 and plain-C builds giving the same bits. Where this
host's build runs bf16 weights on AMX tiles (amx_gemm.h: K a multiple of 32, any batch: the narrow form up to 16
batch rows, the wide form past that; gemm_rows takes the tiles at every B too), the tile path against a reference
on bf16-rounded activations and its batch and split invariance; the bit-identity claims are checked on shapes the
tiles do not take, and on tile shapes by a build without them (-DHD_NO_AMX)."""

from __future__ import annotations

import ctypes
import itertools
import platform
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from runtime.native import build

PROBE = Path(__file__).with_name("native_gemm_probe.c")
_F = ctypes.POINTER(ctypes.c_float)
_I64 = ctypes.c_int64

pytestmark = pytest.mark.skipif(build.find_compiler() is None, reason="needs a C compiler (CI installs gcc)")

# (N, K, B): N off the 4/6/12-row tiles, K off the 8-float vectors and past one 256-long chunk, B across the
# 16-row panels' remainders and past one 64-row panel.
SHAPES = [(1, 8, 12), (13, 24, 12), (37, 200, 17), (50, 264, 33), (24, 520, 48), (7, 300, 70), (130, 256, 64)]


F32, BF16 = 0, 1  # dot_gemm.h's HD_F32, HD_BF16
_V = ctypes.c_void_p


def _load(tmp_path: Path, name: str, flags: tuple[str, ...] = build.DEFAULT_FLAGS) -> ctypes.CDLL:
    lib = build.load(f"{name}_{tmp_path.name}", PROBE, flags).lib
    lib.probe_gemm.argtypes = [ctypes.c_int, _I64, _V, _F, _I64, _I64, _F, _I64, _I64, _F, _I64]
    lib.probe_gemm_set.argtypes = [_I64, _V, _I64, _V, _F, _I64, _I64, _F, _I64, _F, _F]
    lib.probe_set_min_part_bytes.argtypes = [_I64]
    return lib


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ctypes.CDLL]:
    # One build for the module (its own cache dir); the pool test puts the thread count back.
    with pytest.MonkeyPatch.context() as mp:
        tmp = tmp_path_factory.mktemp("gemm")
        mp.setenv(build.CACHE_ENV, str(tmp / "cache"))
        mp.delenv(build.DISABLE_ENV, raising=False)
        build.forget_loaded()
        yield _load(tmp, "gemm_probe")
        build.forget_loaded()


def _ptr(a: np.ndarray | None) -> ctypes._Pointer[ctypes.c_float] | None:
    return None if a is None else a.ctypes.data_as(_F)


def _to_bf16(w: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns (uint16), rounded to nearest even as torch rounds (finite inputs)."""
    u = w.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _widen(h: np.ndarray) -> np.ndarray:
    """bf16 bit patterns -> the fp32 values they stand for (exact)."""
    return (h.astype(np.uint32) << 16).view(np.float32)


def _inputs(n: int, k: int, b: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32)
    # X rows with a stride wider than K (ldx = K + 3): the kernels read a row's first K floats only.
    x = rng.standard_normal((b, k + 3)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    return w, x, bias


def _run(lib: ctypes.CDLL, form: int, w: np.ndarray, x: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """Y of one form; `w` fp32, or uint16 for bf16 weights."""
    n, k = w.shape
    b, ldx = x.shape
    y = np.full((b, n + 5), np.nan, dtype=np.float32)  # ldy = N + 5: the columns past N stay untouched
    dtype = BF16 if w.dtype == np.uint16 else F32
    lib.probe_gemm(form, dtype, w.ctypes.data, _ptr(bias), n, k, _ptr(x), ldx, b, _ptr(y), n + 5)
    assert np.isnan(y[:, n:]).all()
    return y[:, :n]


@pytest.mark.parametrize(("n", "k", "b"), SHAPES)
@pytest.mark.parametrize("form", [0, 1])
def test_each_form_matches_a_float64_reference(probe: ctypes.CDLL, form: int, n: int, k: int, b: int) -> None:
    w, x, bias = _inputs(n, k, b, seed=n * 1000 + k + b)
    for with_bias in (False, True):
        got = _run(probe, form, w, x, bias if with_bias else None)
        xs = x[:, :k].astype(np.float64)
        want = xs @ w.astype(np.float64).T + (bias if with_bias else 0.0)
        # fp32 sums of K products: error within a few K ulps of the sum of |products|.
        bound = 4 * k * 2.0**-24 * (np.abs(xs) @ np.abs(w.astype(np.float64)).T) + 1e-6
        assert (np.abs(got - want) <= bound).all(), f"form {form} off by {np.abs(got - want).max()}"


@pytest.mark.parametrize(("n", "k", "b"), SHAPES[:3] + [(40, 256, 5), (40, 256, 8), (40, 256, 11)])
def test_rows_take_the_dot_form_below_the_threshold_and_the_broadcast_form_from_it(
    probe: ctypes.CDLL, n: int, k: int, b: int
) -> None:
    threshold = probe.probe_wide_rows()
    assert 8 < threshold <= 16  # a decode batch (B <= 8) keeps the dot form
    w, x, bias = _inputs(n, k, b, seed=7)
    got = _run(probe, 2, w, x, bias)
    want = _run(probe, 0 if b < threshold else 1, w, x, bias)
    assert np.array_equal(got, want)


@pytest.mark.parametrize(("n", "k", "b"), SHAPES)
def test_broadcast_form_rows_do_not_depend_on_the_split(probe: ctypes.CDLL, n: int, k: int, b: int) -> None:
    w, x, bias = _inputs(n, k, b, seed=3)
    whole = _run(probe, 1, w, x, bias)
    # Any split of the rows, not only at the 4-row blocks the pool uses: every row is its own fma chain.
    cuts = sorted({0, n, *np.random.default_rng(n).integers(0, n, size=4).tolist()})
    for lo, hi in itertools.pairwise(cuts):
        part = _run(probe, 1, w[lo:hi].copy(), x, bias[lo:hi].copy())
        assert np.array_equal(part, whole[:, lo:hi]), (lo, hi)
    # And a subset of the batch rows (another panel layout) gives those rows' values.
    assert np.array_equal(_run(probe, 1, w, x[1:].copy(), bias), whole[1:])


@pytest.mark.parametrize("b", [3, 8, 12, 48])
@pytest.mark.parametrize("bf16", [False, True])
def test_projections_through_the_pool_are_bit_identical_under_1_2_3_threads(
    probe: ctypes.CDLL, b: int, bf16: bool
) -> None:
    k, n0, n1 = 256, 100, 52
    rng = np.random.default_rng(b)
    w0 = rng.standard_normal((n0, k)).astype(np.float32)
    w1 = rng.standard_normal((n1, k)).astype(np.float32)
    if bf16:
        w0, w1 = _to_bf16(w0), _to_bf16(w1)
    bias1 = rng.standard_normal(n1).astype(np.float32)
    x = rng.standard_normal((b, k)).astype(np.float32)
    probe.probe_set_min_part_bytes(1)  # split to the 4-row block
    results = []
    for threads in (1, 2, 3):
        probe.probe_set_threads(threads)
        y0, y1 = np.zeros((b, n0), np.float32), np.zeros((b, n1), np.float32)
        dtype = BF16 if bf16 else F32
        probe.probe_gemm_set(
            dtype, w0.ctypes.data, n0, w1.ctypes.data, _ptr(bias1), n1, k, _ptr(x), b, _ptr(y0), _ptr(y1)
        )
        results.append((y0, y1))
    probe.probe_set_threads(1)
    probe.probe_set_min_part_bytes(32768)
    for y0, y1 in results[1:]:
        assert np.array_equal(y0, results[0][0]) and np.array_equal(y1, results[0][1])
    # The same bits as one gemm_rows call over all of a projection's rows.
    assert np.array_equal(results[0][0], _run(probe, 2, w0, x, None))


# Decode shapes for the dot form: B of a decode batch (1..8, past the 4-row batch blocks), K on and off the 16 lanes.
DOT_SHAPES = [(1, 16, 1), (4, 16, 2), (13, 24, 1), (37, 200, 5), (50, 264, 8), (24, 1040, 3), (7, 300, 7)]


@pytest.mark.parametrize(("n", "k", "b"), DOT_SHAPES + SHAPES)
@pytest.mark.parametrize("form", [0, 1, 2])
def test_bf16_weights_give_the_bits_of_fp32_weights_rounded_to_bf16(
    probe: ctypes.CDLL, form: int, n: int, k: int, b: int
) -> None:
    """The kernels widen a bf16 weight exactly and then run the fp32 chains: equal bits, not just close. A kernel
    that read a bf16 matrix with the wrong element size, row stride or lane order would be off by far more."""
    if form != 1 and k % 32 == 0 and probe.probe_amx():
        pytest.skip("a tile shape on this host: the tests below check the tiles")
    w, x, bias = _inputs(n, k, b, seed=n + 17 * k + b)
    half = _to_bf16(w)
    assert np.array_equal(_run(probe, form, half, x, bias), _run(probe, form, _widen(half), x, bias))
    assert not np.array_equal(_widen(half), w)  # the rounding is real: fp32 weights would give other sums


def _isa_builds(tmp_path: Path) -> dict[str, ctypes.CDLL]:
    """The probe built for this host (-march=native), without AVX-512 (the AVX2 + FMA path), and for plain x86-64
    without AVX2 or FMA (the plain-C path): the three code paths a user's CPU may take."""
    base = tuple(f for f in build.DEFAULT_FLAGS if f != "-march=native")
    return {
        "native": _load(tmp_path, "gemm_probe_native"),
        "avx2": _load(tmp_path, "gemm_probe_avx2", (*base, "-march=x86-64-v3")),
        "plain": _load(tmp_path, "gemm_probe_plain", (*base, "-mno-avx2", "-mno-fma")),
    }


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the AVX2 and AVX-512 paths are x86's")
@pytest.mark.parametrize("form", [0, 1])
@pytest.mark.parametrize("bf16", [False, True])
def test_plain_c_avx2_and_avx512_paths_give_the_same_bits(tmp_path: Path, form: int, bf16: bool) -> None:
    """Every path computes the same chains (fmaf is one rounding per product-add, as a vector FMA), so a CPU
    without AVX-512, or without AVX2, gets the bits this host gets."""
    builds = _isa_builds(tmp_path)
    assert builds["avx2"].probe_isa() == 1 and builds["plain"].probe_isa() == 0
    if "avx512f" in build._cpu_signature().split():  # noqa: SLF001 - the flags -march=native builds for
        assert builds["native"].probe_isa() == 2
    tiles = bf16 and form == 0 and builds["native"].probe_amx()
    for n, k, b in DOT_SHAPES + SHAPES:
        if tiles and k % 32 == 0:
            continue  # the tiles' bits on this host (checked below), not the FMA chains'
        w, x, bias = _inputs(n, k, b, seed=11)
        weights = _to_bf16(w) if bf16 else w
        results = {name: _run(lib, form, weights, x, bias) for name, lib in builds.items()}
        for name in ("avx2", "plain"):
            assert np.array_equal(results[name], results["native"]), (name, n, k, b)


# Shapes the AMX path takes (K a multiple of 32, any batch): rows off the 16-row tiles, one and two tiles; the
# narrow form (1..16 batch rows) and the wide form (past 16: one to three B tiles per pass, and a second pass).
TILE_SHAPES = [(1, 32, 1), (16, 64, 8), (37, 256, 5), (77, 2048, 8), (50, 512, 16), (33, 96, 11)]
TILE_SHAPES += [(21, 64, 13), (40, 128, 16), (37, 256, 17), (50, 96, 33), (33, 512, 48), (19, 128, 64), (16, 64, 100)]


def _tiles(probe: ctypes.CDLL) -> None:
    if not probe.probe_amx():
        pytest.skip("this host's build has no AMX path (or the kernel refused the tile state)")


@pytest.mark.parametrize(("n", "k", "b"), TILE_SHAPES)
def test_tiles_match_a_reference_on_bf16_rounded_activations(probe: ctypes.CDLL, n: int, k: int, b: int) -> None:
    """X rounded to bf16 (nearest even), products of bf16 values exact, sums in fp32: within the fp32 bound of
    the rounded inputs' product, far inside the ~2**-9 relative error unrounded activations would show."""
    _tiles(probe)
    w, x, bias = _inputs(n, k, b, seed=n + k + b)
    half = _to_bf16(w)
    got = _run(probe, 0, half, x, bias)
    xs = _widen(_to_bf16(x[:, :k].copy())).astype(np.float64)
    ws = _widen(half).astype(np.float64)
    want = xs @ ws.T + bias
    bound = 4 * k * 2.0**-24 * (np.abs(xs) @ np.abs(ws).T) + 1e-6
    assert (np.abs(got - want) <= bound).all(), f"off by {np.abs(got - want).max()}"


@pytest.mark.parametrize(("n", "k", "b"), TILE_SHAPES)
def test_tile_rows_do_not_depend_on_the_batch_or_the_split(probe: ctypes.CDLL, n: int, k: int, b: int) -> None:
    """A batch row's outputs at batch 1 are its outputs in the batch, and any split of the weight rows gives the
    whole call's values: the bits of a decode row never depend on its neighbours or on the thread count."""
    _tiles(probe)
    w, x, bias = _inputs(n, k, b, seed=5)
    half = _to_bf16(w)
    whole = _run(probe, 0, half, x, bias)
    assert np.array_equal(_run(probe, 2, half, x, bias), whole)  # gemm_rows takes the tiles at every B
    for r in range(b):
        assert np.array_equal(_run(probe, 0, half, x[r : r + 1].copy(), bias), whole[r : r + 1]), r
    cuts = sorted({0, n, *np.random.default_rng(n).integers(0, n, size=3).tolist()})
    for lo, hi in itertools.pairwise(cuts):
        assert np.array_equal(_run(probe, 0, half[lo:hi].copy(), x, bias[lo:hi].copy()), whole[:, lo:hi]), (lo, hi)


@pytest.mark.parametrize(("n", "k", "b"), TILE_SHAPES)
def test_without_tiles_bf16_tile_shapes_keep_the_bits_of_rounded_fp32_weights(
    tmp_path: Path, n: int, k: int, b: int
) -> None:
    """A build without the AMX path (-DHD_NO_AMX, what a host without AMX compiles) keeps the fp32 chains on the
    shapes the tiles would take."""
    lib = _load(tmp_path, "gemm_probe_noamx", (*build.DEFAULT_FLAGS, "-DHD_NO_AMX"))
    assert lib.probe_amx() == 0
    w, x, bias = _inputs(n, k, b, seed=n * 3 + k + b)
    half = _to_bf16(w)
    assert np.array_equal(_run(lib, 0, half, x, bias), _run(lib, 0, _widen(half), x, bias))
