"""A small YAML writer for the files launch emits (SGLang --config, Kubernetes manifests).

Only what those need: nested mappings and lists of scalars, block style. Strings are always written as
double-quoted JSON strings (valid YAML), so values like "on", "0.10" or "1e3" never change type on reading.
"""

from __future__ import annotations

import json
from typing import Any


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def _inline(value: Any) -> str:
    if isinstance(value, list):
        return "[]"
    if isinstance(value, dict):
        return "{}"
    return _scalar(value)


def _lines(value: Any, indent: int) -> list[str]:
    pad = "  " * indent
    if isinstance(value, dict):
        if not value:
            return [pad + "{}"]
        out = []
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                out.append(f"{pad}{key}:")
                out.extend(_lines(item, indent + 1))
            else:
                out.append(f"{pad}{key}: {_inline(item)}")
        return out
    if isinstance(value, list):
        out = []
        for item in value:
            if isinstance(item, dict | list) and item:
                nested = _lines(item, indent + 1)
                first = nested[0].lstrip()
                out.append(f"{pad}- {first}")
                out.extend(nested[1:])
            else:
                out.append(f"{pad}- {_inline(item)}")
        return out
    return [pad + _scalar(value)]


def dump_yaml(value: Any) -> str:
    return "\n".join(_lines(value, 0)) + "\n"


def dump_documents(documents: list[Any]) -> str:
    return "---\n".join(dump_yaml(d) for d in documents)
