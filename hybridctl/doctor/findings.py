"""What `doctor` reports: check lines (flutter-doctor style), findings with stable codes and exact fixes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hybridctl.config.findings import Finding, Severity

CheckStatus = Literal["ok", "warning", "error", "skipped"]
FileName = Literal["config.toml", "settings.json"]

# The five failure modes of hybrid serving; every finding carries one (or HOST for plain host problems).
CODES = ("MAMBA_POOL_ALLOC", "PREFIX_CACHE_MISS", "SPEC_ROLLBACK", "ELASTIC_TIMEOUT", "PD_STATE_MISMATCH")


@dataclass(frozen=True)
class Change:
    """One edit `--fix` can write: `key` is the dotted path inside `file` ("memory.max_mamba_cache_size")."""

    file: FileName
    key: str
    value: str | int | float | bool | None  # None removes the key (back to its default)

    def to_dict(self) -> dict[str, object]:
        return {"file": self.file, "key": self.key, "value": self.value}


@dataclass(frozen=True)
class DoctorFinding:
    code: str
    severity: Severity
    cause: str  # what goes wrong, in words
    fix: str  # what to do, in words, naming the key and value
    changes: tuple[Change, ...] = ()  # the same fix as machine-applicable edits (empty: no config edit helps)
    source: Literal["config", "host", "log", "peer", "live"] = "config"
    line: int | None = None  # 1-based line of the evidence in the log (or of the key in the config file)
    evidence: str | None = None  # the log line (cleaned of colours) or the config key = value
    count: int = 1  # log: how many lines said the same thing (ranks, repeats)
    basis: tuple[str, ...] = ()  # log: each piece of evidence the finding rests on (message, frames, model, ...)

    def to_dict(self) -> dict[str, object]:
        return {
            "code": self.code,
            "severity": self.severity,
            "source": self.source,
            "line": self.line,
            "evidence": self.evidence,
            "cause": self.cause,
            "fix": self.fix,
            "changes": [c.to_dict() for c in self.changes],
            "count": self.count,
            "basis": list(self.basis),
        }

    @classmethod
    def from_config_finding(cls, f: Finding, changes: tuple[Change, ...] = ()) -> DoctorFinding:
        evidence = f"{f.file}: {f.key}" if f.key else f.file
        return cls(
            code=f.code,
            severity=f.severity,
            cause=f.message,
            fix=f.fix,
            changes=changes,
            source="config",
            line=f.line,
            evidence=evidence,
        )


@dataclass(frozen=True)
class Check:
    """One line of the report: `[✓] name  summary`, with `details` shown under -v."""

    name: str
    status: CheckStatus
    summary: str
    details: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "status": self.status,
            "summary": self.summary,
            "details": list(self.details),
        }
