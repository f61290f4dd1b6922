"""Rich rendering of a BenchResult (the `--json` form is `BenchResult.to_dict`)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hybridctl.bench.results import BenchResult
from hybridshared.units import format_limit, format_ms, format_number, format_percent


def _rate(rate: float | str | None) -> str:
    """`request_rate` as the config holds it ("inf" in JSON: everything sent at once)."""
    if rate is None or rate == "inf":
        return "no limit (all at once)"
    return f"{format_number(float(rate))} req/s"


def _signed_ms(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms:+.1f} ms"


def render_bench(result: BenchResult, console: Console) -> None:
    cfg = result.config
    console.print(
        f"bench {cfg['dataset']} against {cfg['url']}: {result.completed} completed, {result.failed} failed "
        f"in {format_ms(result.duration_s * 1000)} (max concurrency {format_limit(cfg['max_concurrency'])}, "
        f"request rate {_rate(cfg['request_rate'])})",
        highlight=False,
        soft_wrap=True,  # one line whatever the width: a number never parts from its unit
    )
    table = Table(title="latency", title_justify="left")
    for col in ("metric", "mean", "median", "p90", "p99", "n"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for name, summary in result.latency_ms.items():
        if summary is None:
            table.add_row(name.upper(), "n/a", "n/a", "n/a", "n/a", "0")
            continue
        table.add_row(name.upper(), *(format_ms(summary[k]) for k in ("mean", "median", "p90", "p99")),
                      str(summary["count"]))  # fmt: skip
    console.print(table)
    tp = result.throughput
    console.print(
        f"throughput: {format_number(tp['request_per_s'])} req/s, "
        f"{format_number(tp['output_tok_per_s'], digits=1)} output tok/s, "
        f"{format_number(tp['input_tok_per_s'], digits=1)} input tok/s",
        highlight=False,
        soft_wrap=True,
    )
    accept = "n/a (no speculative decoding)" if result.accept_length is None else f"{result.accept_length:.2f}"
    conc = result.concurrency
    console.print(
        f"cache hit rate (client, cached/prompt tokens): {format_percent(result.cache['hit_rate'])}; accept "
        f"length: {accept}; "
        f"in flight: client max {format_number(conc['client_max_in_flight'])}, server max running "
        f"{format_number(conc['server_max_running'], none='not measured (no /metrics)')}",
        highlight=False,
        soft_wrap=True,
    )
    if result.server:
        s = result.server
        console.print(
            f"server /metrics over the run: TTFT mean {format_ms(s['ttft_mean_ms'])} "
            f"(client differs by {format_percent(s['ttft_relative_diff'])}, {_signed_ms(s['ttft_diff_ms'])}), output "
            f"{format_number(s['output_throughput_tok_s'], none='n/a', digits=1)} tok/s "
            f"(client differs by {format_percent(s['throughput_relative_diff'])}), cache hit rate "
            f"{format_percent(s['cache_hit_rate'])}",
            highlight=False,
            soft_wrap=True,
        )
    for error in result.errors[:5]:
        console.print(f"  [red]✗[/] {escape(error)}", soft_wrap=True)
    for note in result.notes:
        console.print(f"  [dim]• {escape(note)}[/]", soft_wrap=True)
