"""SGLang versions: finding the installed one without importing sglang, and the one commands target.

Importing sglang pulls in CUDA-only packages and takes seconds; package metadata answers "which version" at
once. Parsing and comparing release numbers is hybridctl/config/sglang_version.py.
The feature gates (which flag exists since when) live in the mapping table, hybridctl/launch/mapping.py.
"""

from __future__ import annotations

import importlib.metadata
import subprocess

from hybridctl.config.engine_flags import DEFAULT_SGLANG_VERSION
from hybridctl.config.sglang_version import resolve_release


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


def target_version(requested: str | None = None, configured: str | None = None) -> str:
    """The version commands are written for, in resolve_release's one order: the one asked for, the installed
    one, config.toml's server.sglang_version, else the newest held."""
    return resolve_release(requested, configured, DEFAULT_SGLANG_VERSION)[0]
