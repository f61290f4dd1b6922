"""`check_files`: every finding about config.toml + settings.json, what `hybridctl validate` reports: syntax,
schema, secrets, the cross-file rules and the engine's own (never raises for bad file content)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from hybridctl.config.findings import Finding, ValidationReport
from hybridctl.config.loader import CONFIG_NAME, SETTINGS_NAME, ParsedFile, load_parsed
from hybridctl.config.schema import HybridConfig
from hybridctl.config.secret_scan import scan_for_secrets
from hybridctl.rules.cross_file import check_rules, effective_engine

EngineNotes = Callable[[HybridConfig, "str | None", "str | None", "set[str]"], list[Finding]]


def _secret_findings(parsed: ParsedFile) -> list[Finding]:
    findings = []
    for hit in scan_for_secrets(parsed.data or {}):
        line, column = parsed.locator.find(hit.path) or (None, None)
        dotted = ".".join(hit.path)
        findings.append(
            Finding(
                "error",
                "LITERAL_SECRET",
                parsed.path,
                line,
                column,
                dotted,
                f"`{dotted}` holds {hit.kind} ({hit.length} characters, not shown); files get copied, "
                "committed and printed, so secrets do not belong in them.",
                f"remove the value from {parsed.path}, export it in an environment variable, name that "
                'variable in "api_key_env" of the "api" object of settings.json (e.g. "OPENAI_API_KEY"), '
                "and rotate the exposed key.",
            )
        )
    return findings


def _place(finding: Finding, config_file: ParsedFile, settings_file: ParsedFile) -> Finding:
    """Rules report logical file names; point them at the real files and lines."""
    target = settings_file if finding.file == SETTINGS_NAME else config_file
    line, column = (target.locator.find(finding.key.split(".")) if finding.key else None) or (None, None)
    fix = finding.fix.replace(f"of {finding.file}", f"of {target.path}") if target.path != finding.file else finding.fix
    return replace(finding, file=target.path, line=line, column=column, fix=fix)


def check_files(
    config_path: str | Path = CONFIG_NAME,
    settings_path: str | Path = SETTINGS_NAME,
    engine_version: str | None = None,
    *,
    engine: str | None = None,
    auto_engine: str | None = None,
    engine_notes: EngineNotes | None = None,
) -> ValidationReport:
    """Every finding about the two files: syntax, schema, secrets, cross-file and engine rules.

    `engine` (a --engine flag) or else [server] engine picks the engine-specific rules; "auto" checks against
    `auto_engine`, the engine launch would pick on this host. `engine_notes(cfg, engine, version, present_keys)`
    adds what that engine makes of the keys (launch's translation: ignored keys, other names). Never raises for
    bad file content."""
    cfg, config_file, settings_file = load_parsed(config_path, settings_path)
    findings = [*config_file.findings, *settings_file.findings]
    if settings_file.missing:
        findings.append(
            Finding(
                "info",
                "SETTINGS_DEFAULTS",
                settings_file.path,
                None,
                None,
                "",
                f"{settings_file.path} does not exist; every setting takes its default.",
                "nothing to do, or run `hybridctl init` to write one with the defaults spelled out.",
            )
        )
    findings += _secret_findings(config_file) + _secret_findings(settings_file)
    if cfg is not None and engine_notes is not None:
        present = {".".join(k) for f in (config_file, settings_file) for k in f.locator.positions}
        resolved = effective_engine(cfg, engine, auto_engine)
        findings += [
            _place(f, config_file, settings_file) for f in engine_notes(cfg, resolved, engine_version, present)
        ]
    if cfg is not None:
        findings += [
            _place(f, config_file, settings_file)
            for f in check_rules(
                cfg,
                engine_version=engine_version,
                include_secrets=False,
                engine=effective_engine(cfg, engine, auto_engine),
            )
        ]
    return ValidationReport(
        config_path=config_file.path,
        settings_path=settings_file.path,
        findings=findings,
        config=cfg,
        engine_version=engine_version,
    )
