"""Rich rendering of a launch: the chosen engine and what it ignores, and each server's start-up pools.

The `--json` forms are `LaunchPlan.to_dict` and `StartupInfo.to_dict`.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hybridctl.launch.plan import LaunchPlan
from hybridctl.logs.startup import StartupInfo
from hybridshared.units import GIB, format_gib, format_number


def render_plan(console: Console, plan: LaunchPlan, allowed: bool = True) -> None:
    """The engine line (and why that engine), then each setting the engine will ignore.

    `allowed` False is a dry run without --allow-ignored: the list says that a launch would refuse them.
    """
    version = f" {plan.version}" if plan.version else ""
    console.print(f"engine: [bold]{plan.engine}{version}[/] ({escape(plan.engine_reason)})")
    if plan.ignored and not allowed:
        engine = f"SGLang{version}" if plan.engine == "sglang" else "the bundled runtime"
        console.print(
            f"[yellow]{engine} would ignore {len(plan.ignored)} setting(s)[/]; `hybridctl launch` refuses to start "
            "until they are back at their defaults, or with --allow-ignored:"
        )
        for item in plan.ignored:
            console.print(f"  [yellow]would be ignored:[/] {escape(item.describe())}")
        return
    for item in plan.ignored:
        console.print(f"[yellow]ignored (--allow-ignored):[/] {escape(item.describe())}")


def render_startup(console: Console, role: str, info: StartupInfo) -> None:
    """The pools and limits one server logged while starting, as a table."""
    table = Table(title=f"{role}: start-up", show_header=True, title_justify="left")
    table.add_column("pool / limit")
    table.add_column("value", justify="right")
    if info.mamba:
        m = info.mamba
        table.add_row("state slots (max_mamba_cache_size)", str(m.max_mamba_cache_size))
        # The engines log "GB" computed as bytes / 2**30: GiB, shown as plan shows them.
        table.add_row("state pool (conv + ssm)", format_gib((m.conv_state_gb + m.ssm_state_gb) * GIB, 2))
    for kv in info.kv:
        label = f"{kv.label} " if kv.label else ""
        table.add_row(f"{label}KV pool tokens", f"{kv.tokens} ({format_gib(kv.size_gb * GIB, 2)}, {kv.dtype})")
    for name in ("max_total_num_tokens", "max_running_requests", "chunked_prefill_size", "context_len"):
        value = getattr(info, name)
        if value is not None:
            table.add_row(name, format_number(value))
    if info.tree_cache_impl:
        table.add_row("tree cache", f"{info.tree_cache_impl} (hybrid_ssm {format_number(info.hybrid_ssm)})")
    if table.row_count:
        console.print(table)
    else:
        console.print(f"{escape(role)}: no start-up pool lines in the log")
