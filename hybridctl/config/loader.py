"""Load `config.toml` + `settings.json`.

`load_hybrid_config` is what every command uses (raises ConfigError on syntax or schema errors); `load_parsed`
keeps every syntax and schema finding for `check_files` (hybridctl/rules/check.py), which adds the rules.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit
from pydantic import BaseModel, ValidationError
from tomlkit.exceptions import ParseError

from hybridctl.config.field_docs import iter_field_docs
from hybridctl.config.findings import ConfigError, Finding, ValidationReport
from hybridctl.config.locate import KeyLocator, duplicate_toml_key, object_paths
from hybridctl.config.schema import ConfigToml, HybridConfig, SettingsJson
from hybridctl.config.schema_errors import FileFormat, validation_findings, where
from hybridshared import paths

__all__ = [
    "ConfigError",
    "Finding",
    "ValidationReport",
    "ParsedFile",
    "load_hybrid_config",
    "parse_config_text",
    "parse_settings_text",
    "settings_path_for",
]

CONFIG_NAME = "config.toml"
SETTINGS_NAME = "settings.json"
SCHEMA_REF_KEY = "$schema"  # settings.json may name its JSON Schema for editors; it is not a setting


def settings_path_for(config_path: str | Path, settings_path: str | Path | None = None) -> Path:
    """The settings.json that goes with `config_path`: the one given, else the one in the same directory."""
    return Path(settings_path) if settings_path is not None else Path(config_path).parent / SETTINGS_NAME


@dataclass
class ParsedFile:
    """One file after reading and parsing (not yet schema-checked)."""

    path: str
    fmt: FileFormat
    data: dict[str, Any] | None = None
    locator: KeyLocator = field(default_factory=KeyLocator)
    findings: list[Finding] = field(default_factory=list)
    missing: bool = False


def _read_text(path: Path, fmt: FileFormat, missing_ok: bool) -> tuple[str | None, ParsedFile]:
    parsed = ParsedFile(path=str(path), fmt=fmt)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        parsed.missing = True
        if not missing_ok:
            parsed.findings.append(
                Finding(
                    "error",
                    "FILE_NOT_FOUND",
                    str(path),
                    None,
                    None,
                    "",
                    f"{path} does not exist.",
                    f"run `hybridctl init --out {path.parent}` to write a commented one, or pass the path of yours.",
                )
            )
        return None, parsed
    except OSError as exc:
        parsed.findings.append(
            Finding(
                "error",
                "FILE_UNREADABLE",
                str(path),
                None,
                None,
                "",
                f"cannot read {path}: {exc.strerror or exc}.",
                f"check that {path} is a readable file (not a directory) and its permissions.",
            )
        )
        return None, parsed
    try:
        return raw.decode("utf-8-sig"), parsed
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        parsed.findings.append(
            Finding(
                "error",
                "FILE_ENCODING",
                str(path),
                line,
                column,
                "",
                f"{path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}).",
                f"save {path} as UTF-8.",
            )
        )
        return None, parsed


def parse_config_text(text: str, path: str = CONFIG_NAME) -> ParsedFile:
    """Parse TOML text; syntax errors become a TOML_SYNTAX finding with line and column."""

    parsed = ParsedFile(path=path, fmt="toml")
    try:
        data = tomlkit.parse(text).unwrap()
    except Exception as exc:  # noqa: BLE001  (besides ParseError, tomlkit raises KeyAlreadyPresent & co. bare)
        # ParseError counts columns from 0; every finding counts them from 1, as editors do.
        at = (exc.line, exc.col + 1) if isinstance(exc, ParseError) else None
        parsed.findings.append(_toml_error(text, str(exc), at, path))
        return parsed
    parsed.data = data
    parsed.locator = KeyLocator.for_toml(text)
    return parsed


def _toml_error(text: str, raw: str, at: tuple[int, int] | None, path: str) -> Finding:
    """The finding for a document tomlkit rejects; `at` is its (line, 1-based column) where it gives one."""
    message = re.sub(r" at line \d+ col \d+$", "", raw).rstrip(".")  # the position is reported separately
    duplicate = duplicate_toml_key(text, message)
    if duplicate is not None:
        key, position = duplicate
        line, column = position or at or (None, None)
        return Finding(
            "error",
            "DUPLICATE_KEY",
            path,
            line,
            column,
            key,
            f"`{key}` is defined more than once; TOML allows each key and table once.",
            f"delete the repeated `{key}`{f' at line {line}' if line else ''} of {path} (or merge the two).",
        )
    if "'\\x00'" in message:  # tomlkit's end-of-input marker: the text stops inside a value
        message = "the file ends inside a value (an unclosed [, { or quote?)"
    elif "use \\u000a instead" in message:  # a newline inside a one-line string: its closing quote is missing
        message = "a string runs to the end of its line (a missing closing quote?)"
    line, column = at or (None, None)
    where = f"the TOML at line {line}, column {column} of {path}" if at else path
    return Finding(
        "error",
        "TOML_SYNTAX",
        path,
        line,
        column,
        "",
        f"TOML syntax error: {message}.",
        f"correct {where} (strings need quotes, tables are [name], each key once).",
    )


def parse_settings_text(text: str, path: str = SETTINGS_NAME) -> ParsedFile:
    """Parse JSON text; syntax errors become a JSON_SYNTAX finding, duplicate keys a warning."""
    parsed = ParsedFile(path=path, fmt="json")
    duplicates: list[tuple[dict[str, Any], str]] = []  # (the object, the repeated key)

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                duplicates.append((result, key))
            result[key] = value
        return result

    try:
        data = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        parsed.findings.append(
            Finding(
                "error",
                "JSON_SYNTAX",
                path,
                exc.lineno,
                exc.colno,
                "",
                f"JSON syntax error: {exc.msg}.",
                f"correct the JSON at line {exc.lineno}, column {exc.colno} of {path} (keys in double "
                "quotes, no trailing commas, no comments).",
            )
        )
        return parsed
    except (ValueError, RecursionError) as exc:  # valid JSON Python refuses: over 4300 digits, or nested too deep
        message = (
            "JSON nested too deeply to read."
            if isinstance(exc, RecursionError)
            else f"JSON that cannot be read ({str(exc).split(';')[0]})."  # not Python's advice on its limit
        )
        parsed.findings.append(
            Finding(
                "error",
                "JSON_SYNTAX",
                path,
                None,
                None,
                "",
                message,
                f"{path} holds four small objects of short values; rewrite it (`hybridctl init` writes a fresh one).",
            )
        )
        return parsed
    parsed.locator = KeyLocator.for_json(text)
    parsed.findings.extend(_duplicate_key_findings(parsed.locator, data, duplicates, path))
    if data is None:  # the schema check skips a file without data, so say it here
        parsed.findings.append(_null_document_finding(path))
        return parsed
    if isinstance(data, dict) and isinstance(data.get(SCHEMA_REF_KEY), str):
        data = {k: v for k, v in data.items() if k != SCHEMA_REF_KEY}
    parsed.data = data
    return parsed


def _duplicate_key_findings(
    locator: KeyLocator, data: Any, duplicates: list[tuple[dict[str, Any], str]], path: str
) -> list[Finding]:
    """One DUPLICATE_KEY warning per repeated key (JSON keeps the last), at its place in the file."""
    findings: list[Finding] = []
    paths = object_paths(data)
    for dotted in dict.fromkeys(".".join((*paths.get(id(obj), ()), key)) for obj, key in duplicates):
        keys = tuple(dotted.split("."))
        line, column = locator.find(keys) or (None, None)
        where = f' in the "{".".join(keys[:-1])}" object' if len(keys) > 1 else ""
        findings.append(
            Finding(
                "warning",
                "DUPLICATE_KEY",
                path,
                line,
                column,
                dotted,
                f"key `{keys[-1]}` appears more than once{where}; JSON keeps only the last.",
                f"keep one `{keys[-1]}`{where} of {path}.",
            )
        )
    return findings


def _null_document_finding(path: str) -> Finding:
    return Finding(
        "error",
        "WRONG_TYPE",
        path,
        1,
        1,
        "",
        f"{path} holds null at the top level; it must be one JSON object "
        '({"runtime": {...}, "mamba": {...}, "logging": {...}, "api": {...}}).',
        f"replace the content of {path} with an object, e.g. {{}} for all defaults "
        "(`hybridctl init` writes a full one).",
    )


def _other_file_keys(model: type[BaseModel], file_name: str, fmt: FileFormat) -> dict[str, str]:
    """Key name -> where it belongs in the other file, for "this key lives in settings.json" hints."""

    return {doc.path[-1]: where(doc.path, file_name, fmt) for doc in iter_field_docs(model) if not doc.is_section}


def _validate(parsed: ParsedFile, model: type[BaseModel], other: dict[str, str]) -> BaseModel | None:
    if parsed.data is None:
        return None
    try:
        # strict: "30000" is not a port and 1 is not `true`; the files have real types, so say so.
        return model.model_validate(parsed.data, strict=True)
    except ValidationError as exc:
        parsed.findings.extend(validation_findings(exc, model, parsed.path, parsed.fmt, parsed.locator, other))
        return None


def load_parsed(
    config_path: str | Path, settings_path: str | Path
) -> tuple[HybridConfig | None, ParsedFile, ParsedFile]:
    """The config (None when a file fails to parse or validate) and each file as parsed, with its findings."""
    config_path, settings_path = Path(config_path), Path(settings_path)
    text, config_file = _read_text(config_path, "toml", missing_ok=False)
    if text is not None:
        config_file = parse_config_text(text, str(config_path))
    text, settings_file = _read_text(settings_path, "json", missing_ok=True)
    if text is not None:
        settings_file = parse_settings_text(text, str(settings_path))
    elif settings_file.missing:
        settings_file.data = {}  # settings.json is optional: every setting has a default
    config = _validate(config_file, ConfigToml, _other_file_keys(SettingsJson, settings_file.path, "json"))
    settings = _validate(settings_file, SettingsJson, _other_file_keys(ConfigToml, config_file.path, "toml"))
    if isinstance(config, ConfigToml) and isinstance(settings, SettingsJson):
        _anchor_local_paths(config, config_path.resolve().parent)
        return HybridConfig(config=config, settings=settings), config_file, settings_file
    return None, config_file, settings_file


def _anchor_local_paths(config: ConfigToml, config_dir: Path) -> None:
    """Relative model paths mean "next to config.toml", whatever directory a command runs from.

    A relative path that names nothing beside the config is left alone: it may be a hub id (org/name).
    """
    server, spec = config.server, config.speculative
    for owner, key in ((server, "model_path"), (server, "tokenizer_path"), (spec, "speculative_draft_model_path")):
        value = getattr(owner, key)
        # paths.exists, not Path.exists: a value too long for a file name (or with a NUL byte) is not a local
        # path either; server_rules reports why it cannot be looked up.
        if value and not Path(value).is_absolute() and paths.exists(config_dir / value):
            setattr(owner, key, str(config_dir / value))


def load_hybrid_config(
    config_path: str | Path = CONFIG_NAME, settings_path: str | Path = SETTINGS_NAME
) -> HybridConfig:
    """Both files as one HybridConfig. No settings.json means defaults; a missing config.toml is an error.

    Raises ConfigError (with every syntax and schema error, each located) when the files cannot be used.
    """
    cfg, config_file, settings_file = load_parsed(config_path, settings_path)
    errors = [f for f in (*config_file.findings, *settings_file.findings) if f.severity == "error"]
    if cfg is None or errors:
        raise ConfigError(errors)
    return cfg
