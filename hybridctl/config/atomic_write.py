"""Write files all-or-nothing: refuse to overwrite without force, and never leave a half-written file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from hybridshared import paths


class WouldOverwriteError(FileExistsError):
    """Files exist and `force` was not given; names every one of them."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        names = ", ".join(str(p) for p in paths)
        super().__init__(f"{names} already exist{'s' if len(paths) == 1 else ''}; pass --force to overwrite.")


class WriteFailed(OSError):
    """The file system refused a write (missing or read-only directory, a file where a directory should be)."""


def write_text_atomic(path: Path, text: str) -> None:
    """Write via a temp file in the same directory and os.replace, so readers see the old or the new file.

    The file keeps the mode it had (a new one gets the umask's), not mkstemp's private 0600. Any OSError
    becomes a WriteFailed that names the file.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = path.stat().st_mode & 0o777 if path.exists() else _default_mode()
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _write_failed(path, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _write_failed(path, exc) from None
        raise


def _default_mode() -> int:
    """The mode open() would give a new file: 0666 minus the umask."""
    return 0o666 & ~_umask()


def _umask() -> int:
    # Linux reports the umask in /proc; elsewhere it can only be read by setting it, which is briefly
    # process-wide, so that is the fallback.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def _write_failed(path: Path, exc: OSError) -> WriteFailed:
    blocker = next((p for p in path.parents if paths.exists(p)), None)
    if blocker is not None and not paths.is_dir(blocker):
        why = f"{blocker} is a file, not a directory"
    else:
        why = f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
    return WriteFailed(f"cannot write {path}: {why}. Choose a directory you can write to, or fix its permissions.")


def write_files(files: Mapping[Path, str], *, force: bool = False) -> list[Path]:
    """Write every file, or none when one exists and `force` is false (checked before the first write)."""
    existing = [p for p in files if paths.exists(p)]
    if existing and not force:
        raise WouldOverwriteError(existing)
    for path, text in files.items():
        write_text_atomic(path, text)
    return list(files)
