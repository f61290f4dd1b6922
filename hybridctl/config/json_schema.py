"""JSON Schemas of both files, generated from the pydantic models, for editors (VS Code, Taplo)."""

from __future__ import annotations

from typing import Any, Literal

from hybridctl.config.schema import ConfigToml, SettingsJson

SchemaFile = Literal["config", "settings"]
SCHEMA_FILE_NAMES: dict[SchemaFile, str] = {
    "config": "config.schema.json",
    "settings": "settings.schema.json",
}
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def json_schema(which: SchemaFile) -> dict[str, Any]:
    """The JSON Schema of config.toml ("config") or settings.json ("settings"), with every key's doc."""
    if which == "config":
        schema = ConfigToml.model_json_schema()
        schema["title"] = "hybridctl config.toml"
        schema["description"] = (
            "What to serve and how the engine lays out memory for a hybrid model. Reference: "
            "docs/configuration.md; check with `hybridctl validate`."
        )
    elif which == "settings":
        schema = SettingsJson.model_json_schema()
        schema["title"] = "hybridctl settings.json"
        schema["description"] = (
            "Scheduling, recurrent-state handling, logging and the optional upstream gateway. Reference: "
            "docs/configuration.md; check with `hybridctl validate`."
        )
        # settings.json names its schema for editors; the loader drops the key before validating.
        schema["properties"] = {
            "$schema": {"type": "string", "description": "Path or URL of this JSON Schema (for editors)."},
            **schema["properties"],
        }
    else:
        raise ValueError(f"unknown schema {which!r}; expected 'config' or 'settings'")
    return {"$schema": DRAFT, **schema}
