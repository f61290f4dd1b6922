"""How rules phrase findings: logical file names and the exact `set ... in ...` fix for a dotted key."""

from __future__ import annotations

from hybridctl.config.findings import Finding, Severity

CONFIG = "config.toml"
SETTINGS = "settings.json"


def rule_finding(severity: Severity, code: str, file: str, key: str, message: str, fix: str) -> Finding:
    """A rule's finding: no line yet, `check_files` locates the key in the real file."""
    return Finding(severity, code, file, None, None, key, message, fix)


def toml_set(key: str, value: str) -> str:
    """`set key = value in [section] of config.toml` for a dotted key."""
    section, name = key.rsplit(".", 1)
    return f"set {name} = {value} in [{section}] of {CONFIG}"


def json_set(key: str, value: str) -> str:
    """`set "key": value in the "section" object of settings.json` for a dotted key."""
    section, name = key.rsplit(".", 1)
    return f'set "{name}": {value} in the "{section}" object of {SETTINGS}'
