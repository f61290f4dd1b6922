"""Rich rendering of a BenchResult (the `--json` form is `BenchResult.to_dict`)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hybridctl.bench.results import BenchResult


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def render_bench(result: BenchResult, console: Console) -> None:
    cfg = result.config
    console.print(
        f"bench {cfg['dataset']} against {cfg['url']}: {result.completed} completed, {result.failed} failed "
        f"in {result.duration_s:.2f} s (max concurrency {cfg['max_concurrency']}, request rate "
        f"{cfg['request_rate']})",
        highlight=False,
    )
    table = Table(title="latency (ms)", title_justify="left")
    for col in ("metric", "mean", "median", "p90", "p99", "n"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for name, summary in result.latency_ms.items():
        if summary is None:
            table.add_row(name.upper(), "n/a", "n/a", "n/a", "n/a", "0")
            continue
        table.add_row(name.upper(), *(f"{summary[k]:.2f}" for k in ("mean", "median", "p90", "p99")),
                      str(summary["count"]))  # fmt: skip
    console.print(table)
    tp = result.throughput
    console.print(
        f"throughput: {tp['request_per_s']:.2f} req/s, {tp['output_tok_per_s']:.1f} output tok/s, "
        f"{tp['input_tok_per_s']:.1f} input tok/s",
        highlight=False,
    )
    accept = (
        "n/a (no speculative decoding)" if result.accept_length is None else f"{result.accept_length:.2f}"
    )
    conc = result.concurrency
    console.print(
        f"cache hit rate (client, cached/prompt tokens): {_pct(result.cache['hit_rate'])}; accept "
        f"length: {accept}; "
        f"in flight: client max {conc['client_max_in_flight']}, server max running "
        f"{conc['server_max_running']}",
        highlight=False,
    )
    if result.server:
        s = result.server
        console.print(
            f"server /metrics over the run: TTFT mean {s['ttft_mean_ms']} ms "
            f"(client differs by {_pct(s['ttft_relative_diff'])}), output "
            f"{s['output_throughput_tok_s']} tok/s "
            f"(client differs by {_pct(s['throughput_relative_diff'])}), cache hit rate "
            f"{_pct(s['cache_hit_rate'])}",
            highlight=False,
        )
    for error in result.errors[:5]:
        console.print(f"  [red]✗[/] {escape(error)}", soft_wrap=True)
    for note in result.notes:
        console.print(f"  [dim]• {escape(note)}[/]", soft_wrap=True)
