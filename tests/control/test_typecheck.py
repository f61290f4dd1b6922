"""mypy over the packages pyproject.toml's [tool.mypy] names (hybridctl/; runtime/ joins there later).

Runs the real checker, so an annotation that no longer matches its callers fails the README's test command, not a
user. A cold run takes about half a minute; mypy's own cache (.mypy_cache, ignored by git) makes reruns fast.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_mypy_config_covers_the_control_plane() -> None:
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert "hybridctl" in config["files"]
    assert config["warn_unused_ignores"] is True  # a `# type: ignore` that hides nothing any more must go


@pytest.mark.slow
def test_mypy_passes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=540, check=False
    )
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
