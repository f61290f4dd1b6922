"""Rich rendering of a VerifyReport (the `--json` form is `VerifyReport.to_dict`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hybridctl.verify.report import VerifyReport
from hybridshared.units import format_percent

_STYLE = {"passed": "bold green", "failed": "bold red", "skipped": "yellow"}


def _fmt(value: Any, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _prefix_table(m: dict[str, Any]) -> Table:
    table = Table(title="prefix-cache: TTFT (ms)", title_justify="left")
    for col in ("case", "median", "p90", "warm/cold", "95% CI", "trial spread", "cached tokens"):
        table.add_column(col, justify="right" if col != "case" else "left")
    cold = m["cold_ttft_ms"]
    cached = m["cold_cached_tokens"]
    table.add_row("cold", _fmt(cold["median"]), _fmt(cold["p90"]), "1.00", "", "", f"{min(cached)}-{max(cached)}")
    for case, label in (("realistic", "same doc, new question"), ("identical", "identical prompt")):
        c = m[case]
        r, spread = c["ratio"], c["per_trial_ratio"]
        judged = [row[-1] for row in c["cached_tokens"]]
        table.add_row(
            label,
            _fmt(c["warm_ttft_ms"]["median"]),
            _fmt(c["warm_ttft_ms"]["p90"]),
            f"{r['ratio']:.2f}",
            f"{r['ci_low']:.2f}-{r['ci_high']:.2f}",
            f"{spread['min']:.2f}-{spread['max']:.2f}",
            f"{min(judged)}-{max(judged)} of {m['document_tokens']} ({c['judged_hits']}/{c['judged']} hit)",
        )
    return table


def _upstream_table(m: dict[str, Any]) -> Table:
    table = Table(title="upstream", title_justify="left")
    for col in ("prompt", "local ms", "upstream ms", "tokens (local/upstream)", "agreement"):
        table.add_column(col, justify="left" if col == "prompt" else "right", overflow="fold")
    for row in m["prompts"]:
        local, upstream = row["local"], row["upstream"]

        def ms(side: dict[str, Any]) -> str:
            return f"{side['latency_ms']:.0f}" if side["answered"] else "no answer"

        agreement = "identical" if row["identical"] else _fmt(row["agreeing_prefix"], 2)
        table.add_row(escape(row["prompt"]), ms(local), ms(upstream),
                      f"{local['completion_tokens']}/{upstream['completion_tokens']}", agreement)  # fmt: skip
    return table


def render_report(report: VerifyReport, console: Console) -> None:
    # The URL prints whole on its own line: a table title at 80 characters would break it mid-address.
    console.print(f"hybridctl verify — {escape(report.url)}", highlight=False, soft_wrap=True)
    table = Table()
    table.add_column("check")
    table.add_column("result")
    table.add_column("summary", overflow="fold")
    for check in report.checks:
        table.add_row(check.name, f"[{_STYLE[check.status]}]{check.status}[/]", escape(check.summary))
    console.print(table)
    for check in report.checks:
        if check.name == "prefix-cache" and "cold_ttft_ms" in check.measurements:
            console.print(_prefix_table(check.measurements))
            metrics = check.measurements.get("metrics")
            if metrics:
                console.print(
                    f"  /metrics cache hit rate: {format_percent(metrics['cache_hit_rate_before'])} -> "
                    f"{format_percent(metrics['cache_hit_rate_after'])}; hit rate of this check's prompt tokens "
                    f"{format_percent(metrics['hit_rate_during_check'])}",
                    highlight=False,
                )
        if check.name == "upstream" and "prompts" in check.measurements:
            m = check.measurements
            console.print(f"upstream: local {escape(str(m['local_model']))} vs {escape(str(m['upstream_url']))} "
                          f"({escape(str(m['upstream_model']))})", highlight=False, soft_wrap=True)  # fmt: skip
            console.print(_upstream_table(m))
        if check.status == "failed":
            for reason in check.reasons:
                console.print(f"  [red]✗ {check.name}:[/] {escape(reason)}", soft_wrap=True)
        for note in check.notes:
            console.print(f"  [dim]• {check.name}: {escape(note)}[/]", soft_wrap=True)
    verdict = "[bold green]PASSED[/]" if report.passed else "[bold red]FAILED[/]"
    skipped = [c.name for c in report.checks if c.status == "skipped"]
    # A skipped check proved nothing: the verdict says which did not run, so PASSED is not read as all of them.
    tail = f" ({len(skipped)} check{'s' if len(skipped) != 1 else ''} skipped: {', '.join(skipped)})" if skipped else ""
    console.print(f"verify: {verdict}{escape(tail)}")
