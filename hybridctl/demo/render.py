"""Rich rendering of a DemoReport: the steps, then the verify and bench headlines."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hybridctl.demo.flow import DemoReport

_STYLE = {"ok": "green", "failed": "bold red", "passed": "green", "skipped": "yellow"}


def render_demo(report: DemoReport, console: Console) -> None:
    steps = Table(title=f"hybridctl demo — {report.out_dir}", title_justify="left")
    for col in ("step", "result", "seconds", "detail"):
        steps.add_column(col, overflow="fold", justify="right" if col == "seconds" else "left")
    for s in report.steps:
        steps.add_row(s.name, f"[{_STYLE.get(s.status, 'white')}]{s.status}[/]", f"{s.seconds:.1f}",
                      escape(s.detail))  # fmt: skip
    console.print(steps)
    if report.verify:
        checks = Table(title="verify", title_justify="left")
        for col in ("check", "result", "summary"):
            checks.add_column(col, overflow="fold")
        for c in report.verify["checks"]:
            checks.add_row(
                c["name"], f"[{_STYLE.get(c['status'], 'white')}]{c['status']}[/]", escape(c["summary"])
            )
        console.print(checks)
    if report.bench:
        b = report.bench
        lat = b["latency_ms"]
        ttft = lat["ttft"]["median"] if lat["ttft"] else None
        tpot = lat["tpot"]["median"] if lat["tpot"] else None
        console.print(
            f"bench: {b['completed']} requests at concurrency {b['concurrency']['requested']} "
            f"(server max running {b['concurrency']['server_max_running']}); median TTFT {ttft} ms, "
            f"median TPOT {tpot} ms, {b['throughput']['output_tok_per_s']} output tok/s, "
            f"cache hit rate {b['cache']['hit_rate']}",
            highlight=False,
        )
    if report.report_path:
        console.print(f"report: {escape(report.report_path)}", highlight=False)
    console.print("demo: " + ("[bold green]PASSED[/]" if report.passed else "[bold red]FAILED[/]"))
