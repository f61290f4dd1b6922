"""mypy over the packages pyproject.toml's [tool.mypy] names: hybridshared/, hybridctl/ and runtime/.

Runs the real checker, so an annotation that no longer matches its callers fails the README's test command, not a
user. A cold run takes about half a minute; mypy's own cache (.mypy_cache, ignored by git) makes reruns fast.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomlkit  # not tomllib: Python 3.10 is supported and has none

REPO_ROOT = Path(__file__).resolve().parents[2]


def _mypy_config() -> dict[str, Any]:
    pyproject = tomlkit.parse((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")).unwrap()
    config: dict[str, Any] = pyproject["tool"]["mypy"]
    return config


def test_mypy_config_covers_the_control_plane_and_the_runtime() -> None:
    config = _mypy_config()
    assert "hybridshared" in config["files"]
    assert "hybridctl" in config["files"]
    assert "runtime" in config["files"]
    assert config["warn_unused_ignores"] is True  # a `# type: ignore` that hides nothing any more must go


def test_no_package_is_exempt_from_checking() -> None:
    """Every package is checked in full: an `ignore_errors` override would let a package's own errors through
    (none is exempt)."""
    exempt = [
        module
        for override in _mypy_config().get("overrides", [])
        if override.get("ignore_errors")
        for module in override["module"]
    ]
    assert not exempt, f"exempted from type checking: {exempt}"


@pytest.mark.slow
def test_mypy_passes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=540, check=False
    )
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
