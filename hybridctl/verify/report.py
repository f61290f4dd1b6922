"""The result shapes every check returns, and the JSON shape of `hybridctl verify ... --json`.

JSON: {"passed": bool, "url": str, "checks": [check, ...]} for `verify all` and for each single check alike, where check
= {"name", "status" ("passed" | "failed" | "skipped"), "summary", "reasons", "notes", "measurements"}. A skipped check
neither passes nor fails: the top-level `passed` is true when no check failed and at least one ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["passed", "failed", "skipped"]


@dataclass
class CheckResult:
    name: str
    status: Status
    summary: str
    # Why it failed or was skipped, one self-contained sentence each (what was seen, what to check).
    reasons: list[str] = field(default_factory=list)
    # Observations that are not failures (e.g. SGLang's no_buffer first-miss pattern).
    notes: list[str] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "summary": self.summary,
            "reasons": list(self.reasons),
            "notes": list(self.notes),
            "measurements": self.measurements,
        }


@dataclass
class VerifyReport:
    url: str
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        ran = [c for c in self.checks if c.status != "skipped"]
        return bool(ran) and all(c.status == "passed" for c in ran)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "url": self.url, "checks": [c.to_dict() for c in self.checks]}


def unreachable_report(url: str, message: str) -> dict[str, Any]:
    """The JSON printed when the server cannot be reached at all (exit code 2)."""
    return {"passed": False, "url": url, "error": message, "checks": []}
