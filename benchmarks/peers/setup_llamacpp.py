"""Build llama.cpp's `llama-server` for the peer benchmark, outside the repo's tracked files.

The source is the llama.cpp vendored in the `llama-cpp-python` sdist (PyPI is reachable here, GitHub is not).
Everything lands in benchmarks/peers/.work/ (git-ignored):

    .work/llama_cpp_python-<ver>.tar.gz      the sdist
    .work/llama.cpp/                         its vendor/llama.cpp, unpacked
    .work/llama.cpp/build/bin/llama-server   the binary run.py starts
    .work/gguf-py/ (inside llama.cpp)         the gguf package convert_hf_to_gguf.py imports

    python benchmarks/peers/setup_llamacpp.py [--jobs 2] [--force]

Release build, -DGGML_NATIVE=ON (AVX2/AVX-512 of this CPU), no OpenSSL, no web UI download. Only the
`llama-server` target is built: the rest of the tree is not needed and doubles the build time on 2 cores.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"
VERSION = "0.3.36"
SDIST = WORK / f"llama_cpp_python-{VERSION}.tar.gz"
SRC = WORK / "llama.cpp"
BUILD = SRC / "build"
SERVER_BIN = BUILD / "bin" / "llama-server"
CONVERTER = SRC / "convert_hf_to_gguf.py"
GGUF_PY = SRC / "gguf-py"


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=cwd, check=True)


def download() -> None:
    if SDIST.is_file():
        return
    WORK.mkdir(parents=True, exist_ok=True)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-binary",
            ":all:",
            "--no-deps",
            f"llama-cpp-python=={VERSION}",
            "-d",
            str(WORK),
        ]
    )


def unpack(force: bool) -> None:
    if SRC.is_dir() and not force:
        return
    if SRC.exists():
        shutil.rmtree(SRC)
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
    staging = WORK / ".llama.cpp.unpack"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with tarfile.open(SDIST) as tar:
        members = []
        for m in tar.getmembers():
            if m.name.startswith(prefix) and m.name != prefix.rstrip("/"):
                m.name = m.name[len(prefix) :]
                members.append(m)
        tar.extractall(staging, members=members, filter="data")
    staging.rename(SRC)


def build(jobs: int) -> None:
    _run(
        [
            "cmake",
            "-S",
            str(SRC),
            "-B",
            str(BUILD),
            "-G",
            "Ninja" if shutil.which("ninja") else "Unix Makefiles",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=ON",
            "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_CURL=OFF",
        ]
    )
    _run(["cmake", "--build", str(BUILD), "--target", "llama-server", "-j", str(jobs)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (default 2)")
    parser.add_argument("--force", action="store_true", help="unpack and rebuild from scratch")
    args = parser.parse_args(argv)
    if SERVER_BIN.is_file() and not args.force:
        print(f"already built: {SERVER_BIN}")
        return 0
    start = time.monotonic()
    try:
        download()
        unpack(args.force)
        build(args.jobs)
    except (subprocess.CalledProcessError, OSError, tarfile.TarError) as exc:
        print(f"error: llama.cpp setup failed: {exc}", file=sys.stderr)
        return 1
    print(f"built {SERVER_BIN} in {time.monotonic() - start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
