"""SGLang release numbers: parsing and comparing them (the flag tables, the mapping's gates, launch use it)."""

from __future__ import annotations

import importlib.metadata
import re

VersionKey = tuple[int, int, int, int]

_VERSION_RE = re.compile(r"^\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:\.?post(\d+))?")


class VersionError(ValueError):
    """A version string hybridctl cannot read."""


def version_key(version: str) -> VersionKey:
    """(major, minor, patch, post) of "0.5.15.post1"-style versions; local tags and dev suffixes ignored."""
    match = _VERSION_RE.match(version)
    if not match:
        raise VersionError(f"cannot read the SGLang version {version!r}; expected a release number such as 0.5.23")
    major, minor, patch, post = (int(part or 0) for part in match.groups())
    return major, minor, patch, post


def in_range(version: str, since: str | None, until: str | None) -> bool:
    """since <= version < until (either bound may be open)."""
    key = version_key(version)
    if since is not None and key < version_key(since):
        return False
    return not (until is not None and key >= version_key(until))


def resolve_release(requested: str | None, configured: str | None, newest: str) -> tuple[str, str]:
    """The SGLang release commands are judged for, and where it came from.

    In order: `requested` (--sglang-version), the sglang installed in this interpreter, `configured`
    (config.toml [server] sglang_version), else `newest` (the newest release hybridctl holds).
    """

    if requested:
        version_key(requested)  # fail early on nonsense
        return requested, "--sglang-version"
    try:
        return importlib.metadata.version("sglang"), "installed sglang"
    except importlib.metadata.PackageNotFoundError:
        pass
    if configured:
        return configured, "config.toml [server] sglang_version"
    return newest, "newest release hybridctl holds"
