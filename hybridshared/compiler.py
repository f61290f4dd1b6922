"""Which C compiler this host offers: the bundled runtime builds its native kernels (the decode step, short
extends) with it at first use, and falls back to its much slower torch path without one. One lookup for both the
runtime (runtime/native/build.py) and `doctor`."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

COMPILER_ENV = "CC"
CANDIDATES = ("cc", "gcc", "clang")


def find_c_compiler(environ: Mapping[str, str] | None = None) -> str | None:
    """$CC when set (a name on PATH or a file), else the first of cc, gcc, clang on PATH; None when none is."""
    env = os.environ if environ is None else environ
    explicit = env.get(COMPILER_ENV)
    if explicit:
        return shutil.which(explicit) or (explicit if Path(explicit).is_file() else None)
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None
