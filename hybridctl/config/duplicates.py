"""Where a key is repeated: tomlkit names a duplicate but not its line, and json keeps only the last value."""

from __future__ import annotations

import re
from typing import Any


def duplicate_toml_key(text: str, message: str) -> tuple[str, int, int] | None:
    """tomlkit names a repeated key or table but not where; the second place it is defined, or None."""
    match = re.search(r'Key "([^"]+)" already exists', message)
    if match is None:
        return None
    key = match.group(1)
    name = re.escape(key.rsplit(".", 1)[-1])
    pattern = re.compile(rf"^\s*(?:\[\[?\s*(?:[^\]]*\.)?{name}\s*\]\]?|{name}\s*=)")
    lines = [i for i, line in enumerate(text.splitlines(), start=1) if pattern.match(line)]
    if len(lines) < 2:
        return key, lines[0] if lines else 1, 1
    line = lines[1]
    return key, line, len(text.splitlines()[line - 1]) - len(text.splitlines()[line - 1].lstrip()) + 1


def object_paths(data: Any, path: tuple[str, ...] = ()) -> dict[int, tuple[str, ...]]:
    """id of every JSON object in `data` -> its key path (to name the section a duplicate key sits in)."""
    out: dict[int, tuple[str, ...]] = {}
    if isinstance(data, dict):
        out[id(data)] = path
        for key, value in data.items():
            out.update(object_paths(value, (*path, str(key))))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            out.update(object_paths(value, (*path, str(index))))
    return out
