"""What validation reports: a `Finding` per problem, `ConfigError` when loading cannot go on, the report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from hybridctl.config.schema import HybridConfig

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    """One problem in a config file, located as precisely as possible, with the exact change that fixes it."""

    severity: Severity
    code: str
    file: str
    line: int | None
    column: int | None
    key: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def location(self) -> str:
        """`file:line:column` as editors and terminals make clickable."""
        loc = self.file
        if self.line is not None:
            loc += f":{self.line}"
            if self.column is not None:
                loc += f":{self.column}"
        return loc

    def __str__(self) -> str:
        key = f" [{self.key}]" if self.key else ""
        text = f"{self.location()}: {self.severity} {self.code}{key}: {self.message}"
        if self.fix:
            text += f" Fix: {self.fix}"
        return text


class ConfigError(Exception):
    """The config files cannot be loaded; carries every error found, each with its file, line, key and fix."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = list(findings)
        super().__init__(str(self))

    def __str__(self) -> str:
        errors = [f for f in self.findings if f.severity == "error"] or self.findings
        head = f"{len(errors)} error{'s' if len(errors) != 1 else ''} in the configuration:"
        return "\n".join([head, *(f"  {f}" for f in errors)])


@dataclass
class ValidationReport:
    """Everything `check_files` found; `config` is the loaded configuration when the files were valid."""

    config_path: str
    settings_path: str
    findings: list[Finding] = field(default_factory=list)
    config: HybridConfig | None = None
    engine_version: str | None = None

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def exit_code(self, strict: bool = False) -> int:
        """0 valid, 1 warnings under --strict, 2 errors (the `hybridctl validate` contract)."""
        if self.errors:
            return 2
        if strict and self.warnings:
            return 1
        return 0

    def sorted_findings(self) -> list[Finding]:
        return sorted(
            self.findings,
            key=lambda f: (SEVERITY_ORDER[f.severity], f.file, f.line or 0, f.column or 0, f.code),
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "config_path": self.config_path,
            "settings_path": self.settings_path,
            "engine_version": self.engine_version,
            "valid": self.ok,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "findings": [f.to_dict() for f in self.sorted_findings()],
        }
