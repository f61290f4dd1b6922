"""`doctor --fix`: findings' changes -> edits of config.toml / settings.json; show the diff, write atomically.

TOML is edited through tomlkit so comments, order and formatting stay; JSON is re-dumped with the file's own
indentation and key order. Edited text is checked against the schema before anything is written, so a fix
can never leave a config that `hybridctl` itself would refuse.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import tomlkit
from pydantic import ValidationError

from hybridctl.config.atomic_write import write_text_atomic
from hybridctl.config.schema import ConfigToml, SettingsJson
from hybridctl.doctor.findings import Change, DoctorFinding


class FixError(Exception):
    """The edits could not be made (unreadable file, or the result would not validate); says which and why."""


@dataclass(frozen=True)
class FileEdit:
    path: Path
    before: str  # "" when the file does not exist yet
    after: str
    changes: tuple[Change, ...]

    def diff(self) -> str:
        return "".join(
            difflib.unified_diff(
                self.before.splitlines(keepends=True),
                self.after.splitlines(keepends=True),
                fromfile=f"a/{self.path.name}",
                tofile=f"b/{self.path.name}",
            )
        )


def collect_changes(findings: list[DoctorFinding]) -> list[Change]:
    """One change per key; the most severe finding's change wins (findings come sorted by severity)."""
    chosen: dict[tuple[str, str], Change] = {}
    for finding in findings:
        for change in finding.changes:
            chosen.setdefault((change.file, change.key), change)
    return list(chosen.values())


def plan_edits(changes: list[Change], config_path: Path, settings_path: Path) -> list[FileEdit]:
    edits = []
    for path, file_name, edit in (
        (config_path, "config.toml", _edit_toml),
        (settings_path, "settings.json", _edit_json),
    ):
        mine = tuple(c for c in changes if c.file == file_name)
        if not mine:
            continue
        try:
            before = path.read_text(encoding="utf-8") if path.exists() else ""
        except OSError as exc:
            msg = f"{path}: cannot read it ({exc.strerror}); check the path and permissions."
            raise FixError(msg) from None
        after = edit(before, mine, path)
        if after != before:
            edits.append(FileEdit(path, before, after, mine))
    return edits


def _edit_toml(text: str, changes: tuple[Change, ...], path: Path) -> str:

    doc = tomlkit.parse(text)
    for change in changes:
        *tables, name = change.key.split(".")
        node = doc
        for table in tables:
            if table not in node:
                if change.value is None:
                    break
                node[table] = tomlkit.table()
            node = node[table]
        else:
            if change.value is None:
                node.pop(name, None)
            else:
                node[name] = change.value
    after = tomlkit.dumps(doc)
    _validate(path, ConfigToml, doc.unwrap())
    return after


def _json_indent(text: str) -> int | str:
    m = re.search(r"^\{\s*\n([ \t]+)\S", text)
    if not m:
        return 2
    indent = m.group(1)
    return len(indent) if set(indent) == {" "} else indent


def _edit_json(text: str, changes: tuple[Change, ...], path: Path) -> str:
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        msg = f"{path}: not valid JSON (line {exc.lineno}: {exc.msg}); correct it first."
        raise FixError(msg) from None
    for change in changes:
        *objects, name = change.key.split(".")
        node = data
        for obj in objects:
            node = node.setdefault(obj, {})
        if change.value is None:
            node.pop(name, None)
        else:
            node[name] = change.value
    _validate(path, SettingsJson, {k: v for k, v in data.items() if k != "$schema"})
    after = json.dumps(data, indent=_json_indent(text), ensure_ascii=False)
    return after + "\n" if not text or text.endswith("\n") else after


def _validate(path: Path, model: type[ConfigToml] | type[SettingsJson], data: dict[str, object]) -> None:

    try:
        model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise FixError(
            f"{path}: the fix would make `{key}` invalid ({first['msg']}); nothing was written. "
            "Edit the file by hand following the finding's fix text."
        ) from None


def write_edits(edits: list[FileEdit]) -> None:
    """Write every edited file atomically (temp file in the same directory, then rename); keep its mode."""
    for edit in edits:
        write_text_atomic(edit.path, edit.after)
