"""Turn pydantic validation errors into Findings: file, line, key path, the allowed range, a did-you-mean."""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ValidationError

from hybridctl.config.field_docs import all_key_names, field_doc, model_at
from hybridctl.config.findings import Finding
from hybridctl.config.locate import KeyLocator
from hybridctl.config.secret_scan import classify_secret

FileFormat = Literal["toml", "json"]

_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"}
_TABLE_ERRORS = {"model_type", "model_attributes_type", "dict_type"}


def where(path: Sequence[str], file_name: str, fmt: FileFormat) -> str:
    """Where the key at `path` lives, for humans: `[server] of config.toml`, `the "api" object of ...`."""
    parent = list(path[:-1])
    if not parent:
        return f"the top level of {file_name}"
    if fmt == "toml":
        return f"[{'.'.join(parent)}] of {file_name}"
    return f'the "{".".join(parent)}" object of {file_name}'


def show_value(key: str, value: object, fmt: FileFormat) -> str:
    """The offending value as the user wrote it, redacted when it looks like a credential."""
    if isinstance(value, str) and classify_secret(key, value):
        return f"<a {len(value)}-character secret, not shown>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a table" if fmt == "toml" else "an object"
    if isinstance(value, list):
        return "an array"
    # A string as both files spell one ("0.5"), not as Python does ('0.5').
    text = json.dumps(value, ensure_ascii=False) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _key_path(model: type[BaseModel], loc: Sequence[int | str]) -> tuple[str, ...]:
    """`loc` without pydantic's union-member tags (extra_engine_args.x.str -> extra_engine_args.x)."""
    path: list[str] = []
    for part in loc:
        candidate = (*path, str(part))
        if field_doc(model, candidate) is None and path and model_at(model, path) is None:
            break
        path.append(str(part))
    return tuple(path)


def _did_you_mean(
    model: type[BaseModel], path: tuple[str, ...], fmt: FileFormat, other: dict[str, str], place: str
) -> str:
    """Suggest a sibling with a similar name, or the section/file where a key of that exact name lives."""
    name = path[-1]
    parent = model_at(model, path[:-1])
    siblings = list(parent.model_fields) if parent is not None else []
    elsewhere = all_key_names(model).get(name)
    if elsewhere:
        section = ".".join(elsewhere[0][:-1])
        target = f"[{section}]" if fmt == "toml" else f'the "{section}" object'
        return f"move `{name}` from {place} to {target}."
    if name in other:
        return f"remove `{name}` from {place}; it belongs in {other[name]}."
    close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.6)
    if close:
        return f"rename `{name}` to `{close[0]}` in {place}."
    return f"remove `{name}` from {place}."


def validation_findings(
    exc: ValidationError,
    model: type[BaseModel],
    file_name: str,
    fmt: FileFormat,
    locator: KeyLocator,
    other_file_keys: dict[str, str] | None = None,
) -> list[Finding]:
    """One Finding per offending key (pydantic reports a union failure once per member; they are merged)."""
    findings: dict[tuple[str, ...], Finding] = {}
    for error in exc.errors():
        path = _key_path(model, error["loc"])
        if path in findings:
            continue
        dotted = ".".join(path)
        line, column = locator.find(path) or (None, None)
        place = where(path, file_name, fmt)
        kind = error["type"]
        name = path[-1] if path else ""
        if kind == "extra_forbidden":
            fix = _did_you_mean(model, path, fmt, other_file_keys or {}, place)
            parent = model_at(model, path[:-1])
            known = ", ".join(parent.model_fields) if parent is not None else ""
            findings[path] = Finding(
                "error",
                "UNKNOWN_KEY",
                file_name,
                line,
                column,
                dotted,
                f"unknown key `{name}` in {place}" + (f" (known keys: {known})." if known else "."),
                fix,
            )
            continue
        doc = field_doc(model, path)
        allowed = doc.allowed_text() if doc is not None else "a valid value"
        shown = show_value(name, error.get("input"), fmt)
        if kind == "literal_error":
            code = "INVALID_CHOICE"
        elif kind in _RANGE_ERRORS:
            code = "OUT_OF_RANGE"
        elif kind == "string_pattern_mismatch":
            code = "INVALID_VALUE"
        else:
            code = "WRONG_TYPE"
        if not path:
            message = f"the file must hold a {'table' if fmt == 'toml' else 'JSON object'} at the top level."
            fix = f"make {file_name} a single {'TOML document' if fmt == 'toml' else 'JSON object { ... }'}."
        elif kind in _TABLE_ERRORS or (doc is not None and doc.is_section):
            message = f"`{dotted}` must be a {'table' if fmt == 'toml' else 'JSON object'}, got {shown}."
            header = f"[{dotted}] with its keys" if fmt == "toml" else f'"{dotted}": {{ ... }}'
            fix = f"write {header} in {file_name}."
        else:
            message = f"`{name}` = {shown} is not allowed; expected {allowed}."
            if doc is not None and doc.description:
                message += f" ({doc.description})"
            fix = f"set `{name}` to {allowed} in {place}."
            if kind == "string_pattern_mismatch" and name.endswith("_env"):
                fix = (
                    f'set `{name}` to the NAME of an environment variable (e.g. "OPENAI_API_KEY") '
                    f"in {place}, and export the key in that variable."
                )
        findings[path] = Finding("error", code, file_name, line, column, dotted, message, fix)
    return list(findings.values())
