"""Looking at paths users give, never raising.

A path from a flag or a config value can be anything: longer than the OS allows (ENAMETOOLONG), under a file
(ENOTDIR), a symlink loop, behind a directory the user may not enter, or holding a NUL byte. pathlib's
`exists()` / `is_dir()` / `is_file()` raise for some of those (which ones depends on the Python version); the
functions here answer False for every one, and `lookup_problem` says why, for the message.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

# What a missing path looks like; any other failure to stat a path is worth naming to the user.
_MISSING_ERRNOS = (errno.ENOENT, errno.ENOTDIR)


def _stat(path: str | os.PathLike[str]) -> os.stat_result | OSError | ValueError:
    try:
        return os.stat(path)
    except (OSError, ValueError) as exc:  # ValueError: an embedded NUL byte
        return exc


def exists(path: str | os.PathLike[str]) -> bool:
    """Whether `path` names something (following symlinks); False when it cannot be looked up at all."""
    return isinstance(_stat(path), os.stat_result)


def is_dir(path: str | os.PathLike[str]) -> bool:
    result = _stat(path)
    return isinstance(result, os.stat_result) and stat.S_ISDIR(result.st_mode)


def is_file(path: str | os.PathLike[str]) -> bool:
    result = _stat(path)
    return isinstance(result, os.stat_result) and stat.S_ISREG(result.st_mode)


def lookup_problem(path: str | os.PathLike[str]) -> str | None:
    """Why `path` cannot be looked up ("File name too long", "Permission denied", "contains a NUL byte"), or
    None when it exists or is simply missing."""
    result = _stat(path)
    if isinstance(result, ValueError):
        return "contains a NUL byte"
    if isinstance(result, OSError) and result.errno not in _MISSING_ERRNOS:
        return result.strerror or str(result)
    return None


def resolve(path: str | os.PathLike[str]) -> Path:
    """`path` made absolute with symlinks followed as far as they go; never raises (a symlink loop, which
    `Path.resolve()` turns into RuntimeError on Python 3.11, stays as written)."""
    return Path(os.path.realpath(path))
