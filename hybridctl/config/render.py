"""Render a HybridConfig as the two files, starting from the base templates.

config.toml gets a comment above EVERY key, generated from the schema (doc + type and range), so the file
explains itself; unset optional keys are written commented out (TOML has no null). settings.json cannot hold
comments: it names its JSON Schema in "$schema", which carries the same per-key docs into editors.
"""

from __future__ import annotations

import json
from typing import Any

import tomlkit
from pydantic import BaseModel
from tomlkit.items import Table

from hybridctl.config.field_docs import field_doc
from hybridctl.config.schema import ConfigToml, SettingsJson
from hybridctl.templates import templates_dir

_WRAP = 108


def _comment_lines(text: str) -> list[str]:
    """Wrap a doc into comment lines under the line-length limit."""
    lines, current = [], ""
    for word in text.split():
        if current and len(current) + 1 + len(word) > _WRAP - 2:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        lines.append(current)
    return lines


def _key_doc(model: type[BaseModel], path: tuple[str, ...]) -> str:
    doc = field_doc(model, path)
    if doc is None:
        return ""
    kind = doc.type_text + (f", {doc.allowed}" if doc.allowed else "")
    default = doc.default
    shown = "unset" if default is None else json.dumps(default)
    return f"{doc.description} [{kind}; default {shown}]"


def _toml_value(value: object) -> str:
    return tomlkit.item(value).as_string()


def _add_key(table: Table, model: type[BaseModel], path: tuple[str, ...], value: Any, note: str | None) -> None:
    for line in _comment_lines(_key_doc(model, path)):
        table.add(tomlkit.comment(line))
    for line in _comment_lines(f"init chose this value: {note}" if note else ""):
        table.add(tomlkit.comment(line))
    if value is None:
        table.add(tomlkit.comment(f"{path[-1]} = ...  (unset)"))
    else:
        table.add(path[-1], value)


def render_config_toml(config: ConfigToml, notes: dict[str, str] | None = None) -> str:
    """config.toml text: the template header, then every section and key of the schema with its doc.

    `notes` (dotted key -> reason) adds why init picked a value, e.g. the planner's reason.
    """
    notes = notes or {}
    doc = tomlkit.parse((templates_dir() / "config.toml").read_text(encoding="utf-8"))
    data = config.model_dump()
    for section, values in data.items():
        table = tomlkit.table()
        section_doc = field_doc(ConfigToml, (section,))
        if section == "extra_engine_args":
            for line in _comment_lines(section_doc.description if section_doc else ""):
                table.add(tomlkit.comment(line))
            if not values:
                table.add(tomlkit.comment('Example: mamba-backend = "triton"'))
            for flag, value in values.items():
                table.add(flag, value)
        else:
            if section_doc is not None:
                table.add(tomlkit.comment(f"{section_doc.description}"))
            for key, value in values.items():
                _add_key(table, ConfigToml, (section, key), value, notes.get(f"{section}.{key}"))
        doc.add(tomlkit.nl())
        doc.add(section, table)
    return tomlkit.dumps(doc)


def render_settings_json(settings: SettingsJson) -> str:
    """settings.json text: the template's keys (its "$schema") followed by every setting, nulls included."""
    base: dict[str, Any] = json.loads((templates_dir() / "settings.json").read_text(encoding="utf-8"))
    base.update(settings.model_dump(mode="json"))
    return json.dumps(base, indent=2) + "\n"
