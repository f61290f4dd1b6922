"""`hybridctl init`: write a commented config.toml, settings.json and their JSON Schemas."""

from __future__ import annotations

from pathlib import Path

import typer

from hybridctl.cli.app import app
from hybridctl.cli.config_args import MAX_MEMORY_GIB, json_option
from hybridctl.cli.output import fail, print_json


@app.command("init")
def init(
    out: Path = typer.Option(Path("."), "--out", help="Directory to write the files into."),
    model: str | None = typer.Option(None, "--model", help="Model directory or its config.json (sizes pools)."),
    gpu_mem_gib: float | None = typer.Option(
        None,
        "--gpu-mem-gib",
        min=0.001,
        max=MAX_MEMORY_GIB,
        help="GPU memory per device in GiB (default: detected with NVML).",
    ),
    tp: int = typer.Option(1, "--tp", min=1, max=64, help="Tensor-parallel degree."),
    # Token counts fit a signed 32-bit int, as the engines hold them; larger is no workload, only a broken command.
    context_len: int | None = typer.Option(
        None, "--context-len", min=1, max=2**31 - 1, help="Longest request, in tokens."
    ),
    concurrency: int | None = typer.Option(
        None,
        "--concurrency",
        min=1,
        max=2**31 - 1,
        help="Expected concurrent requests (workload hint for the planner).",
    ),
    engine: str = typer.Option("auto", "--engine", help="auto, sglang or builtin."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
    demo: bool = typer.Option(False, "--demo", help="Build a tiny demo model and serve it with the builtin engine."),
    as_json: bool = json_option("what was written and the plan"),
) -> None:
    """Write config.toml (a comment on every key) and settings.json, sized by the planner for --model.

    Exit codes: 0 written, 2 nothing written (a file exists without --force, or bad input).
    """

    from hybridctl.config.atomic_write import WouldOverwriteError, WriteFailed
    from hybridctl.init.init_project import InitError, InitOptions, init_project

    opts = InitOptions(
        out_dir=out,
        model=model,
        gpu_mem_gib=gpu_mem_gib,
        tp=tp,
        context_len=context_len,
        concurrency=concurrency,
        engine=engine,
        force=force,
        demo=demo,
    )
    try:
        result = init_project(opts)
    except (WouldOverwriteError, WriteFailed, InitError) as exc:
        raise fail(f"{exc} Nothing was written.") from None
    if as_json:
        print_json(result.to_dict())
        return
    from rich.console import Console
    from rich.markup import escape

    console = Console(highlight=False, soft_wrap=True)
    if result.reused:
        console.print(f"kept the demo already in {escape(result.out_dir)} (pass --force to rebuild it)")
    for path in result.files:
        console.print(f"[green]wrote[/] {escape(path)}")
    if result.demo_model:
        console.print(f"demo model: {escape(result.demo_model)}")
    for key, why in result.notes.items():
        console.print(f"  {escape(key)}: {escape(why)}")
    for finding in result.findings:
        console.print(f"[yellow]{escape(str(finding))}[/]")
    if result.plan:
        plan = result.plan
        console.print(
            "plan: "
            + ", ".join(
                f"{k} {plan[k]}"
                for k in ("max_running_requests", "max_mamba_cache_size", "max_total_num_tokens")
                if k in plan
            )
        )
    elif result.plan_skipped:
        console.print(f"[yellow]no plan[/]: {escape(result.plan_skipped)}")
    if not result.config.config.server.model_path:
        # launch refuses a config with nothing to serve: say the step that comes first
        console.print(escape("next: set model_path in [server] of config.toml (or rerun init with --model, --force),"))
        console.print("      then `hybridctl validate` and `hybridctl launch`.")
    else:
        console.print("next: `hybridctl validate` then `hybridctl launch`.")
