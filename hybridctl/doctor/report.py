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


@dataclass(frozen=True)
class IgnoredOption:
    """An option given on the command line that this run could not use, and why (reported, never dropped)."""

    option: str
    reason: str

    def __str__(self) -> str:
        return f"{self.option} ignored: {self.reason}"

    def to_dict(self) -> dict[str, str]:
        return {"option": self.option, "reason": self.reason}


@dataclass
class DoctorReport:
    checks: list[Check] = field(default_factory=list)
    findings: list[DoctorFinding] = field(default_factory=list)
    startup: dict[str, int | None] | None = None  # from --log; None without a log
    ignored: list[IgnoredOption] = field(default_factory=list)

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

    @property
    def skipped(self) -> int:
        """Check lines that could not run (their summary says why)."""
        return sum(c.status == "skipped" for c in self.checks)

    def exit_code(self) -> int:
        """0 clean, 1 warnings, 2 errors."""
        return 2 if self.errors else 1 if self.warnings else 0

    def summary(self) -> str:
        # "No issues found!" only when every check ran and every option was used: a skipped check found nothing
        # because it looked at nothing.
        not_run = [
            f"{n} {word}{'s' if n != 1 else ''} {verb}"
            for n, word, verb in ((self.skipped, "check", "skipped"), (len(self.ignored), "option", "ignored"))
            if n
        ]
        if not self.errors and not self.warnings:
            if not not_run:
                return "No issues found!"
            return f"No issues found in the checks that ran; {' and '.join(not_run)} ([-] above says why)."
        found = [
            f"{n} {word}{'s' if n != 1 else ''}"
            for n, word in ((self.errors, "error"), (self.warnings, "warning"))
            if n
        ]
        tail = f"; {' and '.join(not_run)}" if not_run else ""
        return "Doctor found " + " and ".join(found) + tail + "."

    def to_dict(self) -> dict[str, object]:
        return {
            "checks": [c.to_dict() for c in self.checks],
            "findings": [f.to_dict() for f in self.sorted_findings()],
            "startup": self.startup,
            "summary": self.summary(),
            "exit_code": self.exit_code(),
            "skipped": self.skipped,
            "ignored_options": [i.to_dict() for i in self.ignored],
        }


def failure_mode_checks(
    findings: list[DoctorFinding], judged_by: dict[str, list[str]], not_judged: dict[str, str]
) -> list[Check]:
    """One check line per failure mode: the worst finding of that code decides its mark.

    `judged_by[code]`: the inputs that could have shown it ("the config", "the log", ...). A mode nothing could
    judge is skipped with `not_judged[code]` as the reason, never ✓; a reason beside a judged mode is a detail.
    """
    checks = []
    for code in CODES:
        mine = [f for f in findings if f.code == code]
        sources = judged_by.get(code, [])
        gap = not_judged.get(code)
        if not mine and not sources:
            checks.append(Check(CHECK_TITLES[code], "skipped", f"skipped: {gap or 'nothing to judge it from'}"))
            continue
        worst = min((SEVERITY_ORDER[f.severity] for f in mine), default=None)
        status: CheckStatus = "ok" if worst is None or worst == 2 else "error" if worst == 0 else "warning"
        if not mine:
            summary = f"no {code} predicted from {_words(sources)}"
        else:
            n = len(mine)
            summary = f"{code}: {n} finding{'s' if n != 1 else ''}"
        details = tuple(
            f"{f.severity} ({f.source}{f' line {f.line}' if f.line else ''}): {f.cause}" for f in mine
        ) + ((f"not judged: {gap}",) if gap else ())
        checks.append(Check(CHECK_TITLES[code], status, summary, details))
    return checks


def _words(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else items[0]
