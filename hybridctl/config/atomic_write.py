"""Write files all-or-nothing: refuse to overwrite without force, and never leave a half-written file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path


class WouldOverwriteError(FileExistsError):
    """Files exist and `force` was not given; names every one of them."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        names = ", ".join(str(p) for p in paths)
        super().__init__(f"{names} already exist{'s' if len(paths) == 1 else ''}; pass --force to overwrite.")


def write_text_atomic(path: Path, text: str) -> None:
    """Write via a temp file in the same directory and os.replace, so readers see the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_files(files: Mapping[Path, str], *, force: bool = False) -> list[Path]:
    """Write every file, or none when one exists and `force` is false (checked before the first write)."""
    existing = [p for p in files if p.exists()]
    if existing and not force:
        raise WouldOverwriteError(existing)
    for path, text in files.items():
        write_text_atomic(path, text)
    return list(files)
