"""Building and loading the runtime's C kernels: compiled with the host's C compiler at first use, cached on disk
under a key of (source, compiler, flags, CPU), loaded with ctypes.

Why C through ctypes and not a torch C++ extension: a file of plain C builds in about a second (a torch extension
pulls in the ATen headers: a minute or more), needs no ninja, and a ctypes call releases the GIL, so the event
loop serves HTTP while a kernel runs. Where no compiler works the caller gets the reason and keeps its torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hybridshared.compiler import COMPILER_ENV as COMPILER_ENV
from hybridshared.compiler import find_c_compiler

# -O3 vectorizes the loops; -march=native targets the CPU it runs on (the cache key carries the CPU's flags, so a
# home directory shared between machines never loads a library built for another CPU); -fopenmp-simd honours
# `#pragma omp simd` without linking an OpenMP runtime (torch brings its own). No -ffast-math: a kernel states any
# reassociation it wants with a simd reduction clause, so IEEE semantics (inf, nan, signed zero) hold elsewhere.
# -pthread: the worker pool of parallel.h (older C libraries keep pthreads outside libc).
DEFAULT_FLAGS: tuple[str, ...] = (
    "-O3",
    "-march=native",
    "-fopenmp-simd",
    "-pthread",
    "-fPIC",
    "-shared",
    "-std=c11",
    "-lm",
)
CACHE_ENV = "HYBRIDCTL_NATIVE_CACHE"  # where built libraries live; default $XDG_CACHE_HOME/hybridctl/native
DISABLE_ENV = "HYBRIDCTL_NATIVE"  # "0" or "off": never build or load a native library (the torch path only)

_lock = threading.Lock()
_loaded: dict[str, NativeLibrary] = {}
_ready: dict[str, NativeLibrary | str] = {}  # load_once: the library its setup took, or why there is none
logger = logging.getLogger("runtime.native")


class NativeUnavailable(RuntimeError):
    """No native library: no working C compiler, a compile error, or native kernels turned off. `reason` says
    which, in a form fit for one log line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class NativeLibrary:
    """A loaded library: `lib` (ctypes), the path it was loaded from, and whether this call compiled it
    (False: taken from the cache) with the seconds the compile took."""

    name: str
    lib: ctypes.CDLL
    path: Path
    compiled: bool
    compile_seconds: float


def cache_dir() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hybridctl" / "native"


def native_disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("0", "off", "false", "no")


def find_compiler() -> str | None:
    return find_c_compiler()


def _cpu_signature() -> str:
    """What -march=native depends on: the architecture and, on Linux, the CPU's feature flags."""
    parts = [platform.machine()]
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                parts.append(line.split(":", 1)[1].strip())
                break
    except OSError:
        pass
    return "|".join(parts)


def _compiler_identity(compiler: str) -> str:
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NativeUnavailable(f"C compiler {compiler} does not run: {exc}") from exc
    return out.stdout.splitlines()[0] if out.stdout else compiler


_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _source_with_headers(source: Path) -> str:
    """The source's text followed by every header it includes with quotes (found beside it, recursively): what
    the library is built from, so a changed header gets a new cache key."""
    parts, seen, pending = [], set(), [source]
    while pending:
        path = pending.pop(0)
        if path in seen:
            continue
        seen.add(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise NativeUnavailable(f"cannot read {path}: {exc}") from exc
        parts.append(text)
        pending += [path.parent / name for name in _LOCAL_INCLUDE.findall(text)]
    return "\0".join(parts)


def build_key(source: str, compiler_id: str, flags: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for part in (source, compiler_id, " ".join(flags), _cpu_signature()):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:24]


def load(name: str, source: Path, flags: tuple[str, ...] = DEFAULT_FLAGS) -> NativeLibrary:
    """The library built from the C file `source`, compiled on first use (atomically, into `cache_dir()`) and
    loaded once per process. Raises NativeUnavailable with the reason when it cannot be had."""
    with _lock:
        held = _loaded.get(name)
        if held is not None:
            return held
        library = _build_and_load(name, source, flags)
        _loaded[name] = library
        return library


def load_once(
    name: str,
    source: Path,
    flags: tuple[str, ...],
    setup: Callable[[NativeLibrary], str | None],
    what: str,
    fallback: str,
) -> NativeLibrary | None:
    """`load` for a caller that has a torch path: the library once `setup` (which declares its functions and may
    refuse with a reason, e.g. a CPU feature it lacks) took it; None when it cannot be had, the reason logged once
    naming `what` and `fallback` (what runs instead). A `setup` that raises keeps nothing: the next call tries again."""
    held = _ready.get(name)
    if isinstance(held, NativeLibrary):
        return held
    if held is not None:
        return None
    try:
        lib = load(name, source, flags)
    except NativeUnavailable as exc:
        _ready[name] = exc.reason
        logger.warning("%s unavailable: %s; %s", what, exc.reason, fallback)
        return None
    reason = setup(lib)
    if reason is not None:
        _ready[name] = reason
        logger.info("%s off: %s; %s", what, reason, fallback)
        return None
    _ready[name] = lib
    return lib


def load_state(name: str) -> bool | str | None:
    """What `load_once` made of `name`: None while no one has asked, True when loaded, else the reason."""
    held = _ready.get(name)
    return held if held is None or isinstance(held, str) else True


def _build_and_load(name: str, source: Path, flags: tuple[str, ...]) -> NativeLibrary:
    if native_disabled():
        raise NativeUnavailable(f"native kernels are off ({DISABLE_ENV}={os.environ.get(DISABLE_ENV)})")
    compiler = find_compiler()
    if compiler is None:
        raise NativeUnavailable("no C compiler found (set CC, or install gcc or clang)")
    text = _source_with_headers(source)
    key = build_key(text, _compiler_identity(compiler), flags)
    filename = f"{name}-{key}.so"
    primary = cache_dir() / filename
    # Unless the cache is set explicitly, a private directory under the system's temporary directory stands in
    # for an unwritable one: a read-only home then costs a rebuild per boot, not the native path.
    explicit = bool(os.environ.get(CACHE_ENV))
    existing = None if explicit else _private_temp_dir(create=False)
    candidates = [primary] + ([existing / filename] if existing is not None else [])
    target = next((path for path in candidates if path.is_file()), None)
    compiled, seconds = target is None, 0.0
    if target is None:
        try:
            target, seconds = primary, _compile(compiler, source, primary, flags)
        except _CacheNotWritable as exc:
            private = None if explicit else _private_temp_dir(create=True)
            if private is None:
                raise NativeUnavailable(str(exc)) from exc
            target = private / filename
            seconds = _compile(compiler, source, target, flags)
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as exc:
        raise NativeUnavailable(f"{target} does not load: {exc}; delete it to rebuild") from exc
    return NativeLibrary(name, lib, target, compiled, seconds)


def _private_temp_dir(*, create: bool) -> Path | None:
    """$TMPDIR/hybridctl-native-<uid> (made 0700 with `create`); None when absent, or when it is not this user's
    alone: another user could plant a library there."""
    path = Path(tempfile.gettempdir()) / f"hybridctl-native-{os.getuid()}"
    try:
        if create:
            path.mkdir(mode=0o700, exist_ok=True)
        st = path.lstat()
    except OSError:
        return None
    if path.is_symlink() or not path.is_dir() or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return path


class _CacheNotWritable(NativeUnavailable):
    pass


def _compile(compiler: str, source: Path, target: Path, flags: tuple[str, ...]) -> float:
    # Built under a temporary name in the same directory, then renamed: a concurrent process sees either no
    # library or a whole one.
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.stem}-", suffix=".so", dir=target.parent)
    except OSError as exc:
        raise _CacheNotWritable(
            f"cannot write the native cache {target.parent}: {exc} (set {CACHE_ENV} to a writable directory)"
        ) from exc
    os.close(fd)
    # The linker flag goes after the source, or the library it names is dropped as unused.
    compile_flags = [f for f in flags if not f.startswith("-l")]
    libs = [f for f in flags if f.startswith("-l")]
    command = [compiler, *compile_flags, "-o", tmp, str(source), *libs]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        Path(tmp).unlink(missing_ok=True)
        raise NativeUnavailable(f"compiling {source.name} failed to run: {exc}") from exc
    if done.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        first = (done.stderr.strip().splitlines() or ["no output"])[:3]
        raise NativeUnavailable(f"compiling {source.name} with {compiler} failed: {' / '.join(first)}")
    os.replace(tmp, target)
    return time.perf_counter() - start


def forget_loaded() -> None:
    """Drop the per-process table (tests: the next `load` goes to the cache or the compiler again)."""
    with _lock:
        _loaded.clear()
