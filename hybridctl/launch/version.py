"""SGLang versions: parsing, comparing, and finding the installed one without importing sglang.

Importing sglang pulls in CUDA-only packages and takes seconds; package metadata answers "which version" at
once.
The feature gates themselves (which flag exists since when) live in the mapping table, hybridctl/launch/mapping.py.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess

from hybridctl.config.engine_flags import DEFAULT_SGLANG_VERSION

VersionKey = tuple[int, int, int, int]

_VERSION_RE = re.compile(r"^\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:\.?post(\d+))?")


class VersionError(ValueError):
    """A version string hybridctl cannot read."""


def version_key(version: str) -> VersionKey:
    """(major, minor, patch, post) of "0.5.15.post1"-style versions; local tags and dev suffixes ignored."""
    match = _VERSION_RE.match(version)
    if not match:
        raise VersionError(
            f"cannot read the SGLang version {version!r}; expected a release number such as 0.5.23"
        )
    return tuple(int(part or 0) for part in match.groups())  # type: ignore[return-value]


def in_range(version: str, since: str | None, until: str | None) -> bool:
    """since <= version < until (either bound may be open)."""
    key = version_key(version)
    if since is not None and key < version_key(since):
        return False
    return not (until is not None and key >= version_key(until))


def installed_sglang_version(python: str | None = None) -> str | None:
    """The sglang version installed in this interpreter (or in `python`, e.g. a venv's), None when absent."""
    if python is None:
        try:
            return importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            return None
    probe = (
        "import importlib.metadata as m\ntry: print(m.version('sglang'))\nexcept m.PackageNotFoundError: pass"
    )
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def target_version(requested: str | None = None) -> str:
    """The version commands are written for: the one asked for, else the installed one, else the newest."""
    if requested:
        version_key(requested)  # fail early on nonsense
        return requested
    return installed_sglang_version() or DEFAULT_SGLANG_VERSION
