"""Rich rendering of a DemoReport: the steps, then the verify and bench headlines."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hybridctl.demo.flow import DemoReport
from hybridshared.units import format_limit, format_ms, format_number, format_percent

_STYLE = {"ok": "green", "failed": "bold red", "passed": "green", "skipped": "yellow"}


def render_demo(report: DemoReport, console: Console) -> None:
    # The steps are lines, not a table: their details hold paths (the model, the log), and a table column at 80
    # characters (a pipe, a CI log) would cut a path mid-name. A line keeps each path whole.
    console.print(f"hybridctl demo — {escape(report.out_dir)}", highlight=False, soft_wrap=True)
    width = max((len(s.name) for s in report.steps), default=0)
    for s in report.steps:
        status = f"[{_STYLE.get(s.status, 'white')}]{s.status:<6}[/]"
        console.print(f"  {status} {s.name:<{width}} {format_ms(s.seconds * 1000):>8}  {escape(s.detail)}",
                      highlight=False, soft_wrap=True)  # fmt: skip
    if report.verify:
        checks = Table(title="verify", title_justify="left")
        for col in ("check", "result", "summary"):
            checks.add_column(col, overflow="fold")
        for c in report.verify["checks"]:
            checks.add_row(c["name"], f"[{_STYLE.get(c['status'], 'white')}]{c['status']}[/]", escape(c["summary"]))
        console.print(checks)
    if report.bench:
        b = report.bench
        lat = b["latency_ms"]
        ttft = lat["ttft"]["median"] if lat["ttft"] else None
        tpot = lat["tpot"]["median"] if lat["tpot"] else None
        conc = b["concurrency"]
        console.print(
            f"bench: {b['completed']} requests at concurrency {format_limit(conc['requested'])} "
            f"(server max running {format_number(conc['server_max_running'], none='not measured')}); "
            f"median TTFT {format_ms(ttft)}, median TPOT {format_ms(tpot)}, "
            f"{format_number(b['throughput']['output_tok_per_s'], digits=1)} output tok/s, "
            f"cache hit rate {format_percent(b['cache']['hit_rate'])}",
            highlight=False,
            soft_wrap=True,  # one line whatever the width: a number never parts from its unit
        )
    if report.report_path:
        console.print(f"report: {escape(report.report_path)}", highlight=False)
    console.print("demo: " + ("[bold green]PASSED[/]" if report.passed else "[bold red]FAILED[/]"))
