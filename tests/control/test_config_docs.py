"""Generated artefacts stay in step with the schema: docs/configuration.md and the JSON Schemas."""

from __future__ import annotations

from pathlib import Path

from hybridctl.config.docs_table import render_configuration_md
from hybridctl.config.field_docs import iter_field_docs
from hybridctl.config.schema import ConfigToml, SettingsJson, json_schema

REPO = Path(__file__).resolve().parents[2]


def test_committed_configuration_md_is_current() -> None:
    committed = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == render_configuration_md(), (
        "docs/configuration.md is stale: run `hybridctl schema --docs > docs/configuration.md`"
    )


def test_docs_list_every_key() -> None:
    text = render_configuration_md()
    for model in (ConfigToml, SettingsJson):
        for doc in iter_field_docs(model):
            assert doc.dotted in text
            assert doc.description, f"{doc.dotted} has no description in schema.py"


def test_json_schemas_describe_every_key() -> None:
    for which, model in (("config", ConfigToml), ("settings", SettingsJson)):
        schema = json_schema(which)  # type: ignore[arg-type]
        assert schema["$schema"].startswith("https://json-schema.org/")
        defs = schema.get("$defs", {})
        for name, info in model.model_fields.items():
            prop = schema["properties"][name]
            assert prop.get("description") == info.description
            ref = prop.get("$ref", "")
            if ref:
                section = defs[ref.rsplit("/", 1)[-1]]
                assert section["additionalProperties"] is False
                assert all(p.get("description") for p in section["properties"].values())
    assert "$schema" in json_schema("settings")["properties"]


def test_every_emitted_code_is_documented() -> None:
    """Codes in Finding(...) calls of hybridctl/config, rules and init and FINDING_CODES are the same set."""
    import re

    from hybridctl.config.findings import FINDING_CODES

    sources = {
        p: p.read_text()
        for package in ("config", "rules", "init")
        for p in (REPO / "hybridctl" / package).glob("*.py")
        if p.name != "codes.py"
    }
    emitted = set()
    for text in sources.values():
        emitted |= set(re.findall(r'"(?:error|warning|info)",\s*"([A-Z][A-Z_]+)"', text))
    assert emitted <= FINDING_CODES.keys(), emitted - FINDING_CODES.keys()
    for code in FINDING_CODES:
        assert any(f'"{code}"' in text for text in sources.values()), f"{code} is never emitted"
