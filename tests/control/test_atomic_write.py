"""config/atomic_write: all-or-nothing writes that keep the file's mode and name the file when they fail."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hybridctl.config.atomic_write import WriteFailed, write_text_atomic


def test_atomic_write_keeps_the_mode_of_the_file_it_replaces(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("old\n")
    path.chmod(0o640)
    write_text_atomic(path, "new\n")
    assert path.read_text() == "new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_atomic_write_gives_a_new_file_the_umask_mode(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "new.toml", "x\n")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "new.toml").stat().st_mode) == 0o644  # not mkstemp's private 0600


def test_atomic_write_failure_names_the_file_and_leaves_no_temp_file(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    with pytest.raises(WriteFailed, match="is a file, not a directory"):
        write_text_atomic(blocker / "config.toml", "x\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]
