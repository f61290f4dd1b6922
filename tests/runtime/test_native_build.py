"""The native kernels' build: compiled once with the host's compiler, taken from the on-disk cache after, and a
clear reason (never a traceback) when no library can be had."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from runtime.native import build

SOURCE = """
#include <math.h>
double scaled_norm(const float *x, long n, double scale) {
    double acc = 0.0;
    for (long i = 0; i < n; i++) acc += (double)x[i] * x[i];
    return scale * sqrt(acc);
}
"""


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(build.DISABLE_ENV, raising=False)
    monkeypatch.delenv(build.COMPILER_ENV, raising=False)
    build.forget_loaded()
    yield
    build.forget_loaded()


def _source(tmp_path: Path, text: str = SOURCE) -> Path:
    path = tmp_path / "kernels.c"
    path.write_text(text)
    return path


def _call(lib: ctypes.CDLL, values: list[float], scale: float) -> float:
    fn = lib.scaled_norm
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_long, ctypes.c_double]
    array = (ctypes.c_float * len(values))(*values)
    return fn(array, len(values), scale)


@pytest.mark.skipif(build.find_compiler() is None, reason="needs a C compiler (CI installs gcc)")
def test_compiles_once_then_loads_from_the_cache(tmp_path: Path) -> None:
    source = _source(tmp_path)
    first = build.load("probe", source)
    assert first.compiled and first.path.is_file()
    assert _call(first.lib, [3.0, 4.0], 2.0) == pytest.approx(10.0)
    assert build.load("probe", source) is first  # once per process
    build.forget_loaded()
    again = build.load("probe", source)
    assert not again.compiled and again.path == first.path
    # No temporary files left beside the library.
    assert [p.name for p in first.path.parent.iterdir()] == [first.path.name]


@pytest.mark.skipif(build.find_compiler() is None, reason="needs a C compiler (CI installs gcc)")
def test_a_changed_source_gets_its_own_library(tmp_path: Path) -> None:
    first = build.load("probe", _source(tmp_path))
    build.forget_loaded()
    second = build.load("probe", _source(tmp_path, SOURCE.replace("scale * sqrt", "2.0 * scale * sqrt")))
    assert second.compiled and second.path != first.path
    assert _call(second.lib, [3.0, 4.0], 1.0) == pytest.approx(10.0)


@pytest.mark.skipif(build.find_compiler() is None, reason="needs a C compiler (CI installs gcc)")
def test_a_compile_error_is_a_reason_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(build.NativeUnavailable, match=r"compiling kernels.c .* failed"):
        build.load("broken", _source(tmp_path, "int f( {"))
    assert not any(p.suffix == ".so" for p in (tmp_path / "cache").iterdir())


def test_no_compiler_is_a_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(build.COMPILER_ENV, str(tmp_path / "no-such-cc"))
    with pytest.raises(build.NativeUnavailable, match="no C compiler"):
        build.load("probe", _source(tmp_path))


def test_turned_off_by_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(build.DISABLE_ENV, "0")
    with pytest.raises(build.NativeUnavailable, match="off"):
        build.load("probe", _source(tmp_path))


@pytest.mark.skipif(build.find_compiler() is None, reason="needs a C compiler (CI installs gcc)")
def test_an_unwritable_explicit_cache_is_a_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(build.CACHE_ENV, str(blocker / "cache"))  # under a file: not even root can create it
    with pytest.raises(build.NativeUnavailable, match="cannot write the native cache"):
        build.load("probe", _source(tmp_path))


@pytest.mark.skipif(build.find_compiler() is None, reason="needs a C compiler (CI installs gcc)")
def test_an_unwritable_home_cache_falls_back_to_a_private_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.delenv(build.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    first = build.load("probe", _source(tmp_path))
    private = first.path.parent
    assert first.compiled and private.parent == tmp_path / "tmp" and private.name.startswith("hybridctl-native-")
    assert private.stat().st_mode & 0o777 == 0o700
    assert _call(first.lib, [3.0, 4.0], 1.0) == pytest.approx(5.0)
    build.forget_loaded()
    again = build.load("probe", _source(tmp_path))
    assert not again.compiled and again.path == first.path
    # A directory others can write to is never used: another user could plant a library there.
    build.forget_loaded()
    for lib in private.iterdir():
        lib.unlink()
    private.chmod(0o777)
    with pytest.raises(build.NativeUnavailable, match="cannot write the native cache"):
        build.load("probe", _source(tmp_path))


@pytest.mark.skipif(build.find_compiler() is None, reason="needs a C compiler (CI installs gcc)")
def test_a_changed_local_header_gets_its_own_library(tmp_path: Path) -> None:
    (tmp_path / "scale.h").write_text("#define SCALE 1.0\n")
    source = _source(tmp_path, '#include "scale.h"\n' + SOURCE.replace("scale * sqrt", "SCALE * scale * sqrt"))
    first = build.load("probe", source)
    assert _call(first.lib, [3.0, 4.0], 1.0) == pytest.approx(5.0)
    build.forget_loaded()
    (tmp_path / "scale.h").write_text("#define SCALE 3.0\n")
    second = build.load("probe", source)
    assert second.compiled and second.path != first.path
    assert _call(second.lib, [3.0, 4.0], 1.0) == pytest.approx(15.0)
