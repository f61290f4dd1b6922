"""scripts/lower_bounds.py against the real pyproject.toml: every dependency CI installs has a lower bound, the pins
it writes are what pyproject.toml declares and parse as a pip constraints file, so a new or changed dependency
fails here in seconds rather than in .ci/run's lower-bounds job."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomlkit  # not tomllib: Python 3.10 is supported and has none
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import lower_bounds  # noqa: E402  (a script, not a package: found through the path above)

PYPROJECT = tomlkit.parse((REPO / "pyproject.toml").read_text(encoding="utf-8")).unwrap()


def _declared() -> dict[str, Requirement]:
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    requirements = [*project["dependencies"], *extras["runtime"], *extras["dev"]]
    return {lower_bounds.normalise(req.name): req for req in map(Requirement, requirements)}


def _pins(text: str) -> dict[str, Requirement]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return {lower_bounds.normalise(req.name): req for req in map(Requirement, lines)}


def test_the_script_pins_every_declared_dependency_to_its_lower_bound(tmp_path: Path) -> None:
    out = tmp_path / "pins" / "constraints.txt"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "lower_bounds.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    pins, declared = _pins(out.read_text(encoding="utf-8")), _declared()
    assert pins.keys() == declared.keys()
    for name, pin in pins.items():
        [spec] = pin.specifier
        assert spec.operator == "==", pin
        lowest = [s.version for s in declared[name].specifier if s.operator in (">=", "==")]
        assert lowest == [spec.version], f"{name}: pinned {spec.version}, declared {declared[name].specifier}"
        assert pin.marker == declared[name].marker  # uvloop stays off Windows


def test_every_lower_bound_is_a_plain_release_and_an_upper_bound_is_rare() -> None:
    for name, req in _declared().items():
        lowest = [s.version for s in req.specifier if s.operator in (">=", "==")]
        assert len(lowest) == 1 and re.fullmatch(r"[0-9]+(\.[0-9]+)*", lowest[0]), f"{name}: {req.specifier}"
    capped = sorted(name for name, req in _declared().items() if any(s.operator in ("<", "<=") for s in req.specifier))
    # An upper bound belongs only where a release is known to break the project; none does today.
    assert capped == []


@pytest.mark.parametrize(
    ("requirement", "says"),
    [
        ("typer", "needs exactly one lower bound"),
        ("rich<14", "needs exactly one lower bound"),
        ("httpx>=0.27rc1", "plain release number"),
    ],
)
def test_a_dependency_without_a_usable_lower_bound_is_refused_by_name(requirement: str, says: str) -> None:
    pyproject = {"project": {"dependencies": ["pydantic>=2.10.0", requirement]}}
    with pytest.raises(ValueError, match=says) as caught:
        lower_bounds.constraints_text(pyproject)
    assert requirement in str(caught.value)


def test_a_package_declared_twice_must_name_one_bound() -> None:
    pyproject = {
        "project": {
            "dependencies": ["prometheus_client>=0.20"],
            "optional-dependencies": {"runtime": ["prometheus-client>=0.21"]},
        }
    }
    with pytest.raises(ValueError, match="prometheus-client is declared twice"):
        lower_bounds.floors(pyproject)


def test_releases_compare_as_pip_compares_them() -> None:
    assert lower_bounds.release("13") == lower_bounds.release("13.0.0")
    assert lower_bounds.release("0.20") != lower_bounds.release("0.2")
