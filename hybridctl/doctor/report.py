"""The doctor's result: check lines, findings and start-up numbers; its exit code and JSON shape."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridctl.config.findings import SEVERITY_ORDER
from hybridctl.doctor.findings import CODES, Check, CheckStatus, DoctorFinding

CHECK_TITLES = {
    "MAMBA_POOL_ALLOC": "State pool",
    "PREFIX_CACHE_MISS": "Prefix cache",
    "SPEC_ROLLBACK": "Speculative decoding",
    "ELASTIC_TIMEOUT": "Elastic pool",
    "PD_STATE_MISMATCH": "PD disaggregation",
}
# Check lines that summarise findings (whose severities are already counted): the failure modes, the log, and
# the planner's pools (a pool that cannot be built is also a MAMBA_POOL_ALLOC finding).
SUMMARY_CHECKS = {*CHECK_TITLES.values(), "Log", "Pools"}


@dataclass
class DoctorReport:
    checks: list[Check] = field(default_factory=list)
    findings: list[DoctorFinding] = field(default_factory=list)
    startup: dict[str, int | None] | None = None  # from --log; None without a log

    def sorted_findings(self) -> list[DoctorFinding]:
        """Config and host findings by severity; then what the log and the server showed, in the order they
        showed it (first cause first)."""
        ordered = ("log", "live")
        first = [f for f in self.findings if f.source not in ordered]
        first.sort(key=lambda f: (SEVERITY_ORDER[f.severity], f.code, f.line or 0))
        rest = [f for f in self.findings if f.source in ordered]
        rest.sort(key=lambda f: (ordered.index(f.source), f.line or 0))
        return first + rest

    def _own_checks(self) -> list[Check]:
        # Failure-mode lines only summarise findings; counting them too would count every problem twice.
        return [c for c in self.checks if c.name not in SUMMARY_CHECKS]

    @property
    def errors(self) -> int:
        checks = sum(c.status == "error" for c in self._own_checks())
        return sum(f.severity == "error" for f in self.findings) + checks

    @property
    def warnings(self) -> int:
        checks = sum(c.status == "warning" for c in self._own_checks())
        return sum(f.severity == "warning" for f in self.findings) + checks

    def exit_code(self) -> int:
        """0 clean, 1 warnings, 2 errors."""
        return 2 if self.errors else 1 if self.warnings else 0

    def summary(self) -> str:
        if not self.errors and not self.warnings:
            return "No issues found!"
        found = [
            f"{n} {word}{'s' if n != 1 else ''}"
            for n, word in ((self.errors, "error"), (self.warnings, "warning"))
            if n
        ]
        return "Doctor found " + " and ".join(found) + "."

    def to_dict(self) -> dict[str, object]:
        return {
            "checks": [c.to_dict() for c in self.checks],
            "findings": [f.to_dict() for f in self.sorted_findings()],
            "startup": self.startup,
            "summary": self.summary(),
            "exit_code": self.exit_code(),
        }


def failure_mode_checks(findings: list[DoctorFinding], sources: str) -> list[Check]:
    """One check line per failure mode: the worst finding of that code decides its mark."""
    checks = []
    for code in CODES:
        mine = [f for f in findings if f.code == code]
        worst = min((SEVERITY_ORDER[f.severity] for f in mine), default=None)
        status: CheckStatus = "ok" if worst is None or worst == 2 else "error" if worst == 0 else "warning"
        if not mine:
            summary = f"no {code} predicted from {sources}"
        else:
            n = len(mine)
            summary = f"{code}: {n} finding{'s' if n != 1 else ''}"
        details = tuple(
            f"{f.severity} ({f.source}{f' line {f.line}' if f.line else ''}): {f.cause}" for f in mine
        )
        checks.append(Check(CHECK_TITLES[code], status, summary, details))
    return checks
