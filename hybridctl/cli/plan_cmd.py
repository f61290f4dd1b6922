"""`hybridctl plan [CONFIG] [SETTINGS]`: how the serving engine will split memory between KV and recurrent state:
the target SGLang release's sizing for engine sglang, the bundled runtime's own for engine builtin."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

import typer

from hybridctl.cli.app import app
from hybridctl.cli.config_args import (
    MAX_MEMORY_BYTES,
    MAX_MEMORY_GIB,
    NO_FILES,
    ConfigFiles,
    engine_option,
    json_option,
    takes_config_files,
)
from hybridctl.cli.output import fail, print_json

if TYPE_CHECKING:
    from hybridctl.planner.plan import Plan
    from hybridshared.model.shape import ModelShape


def _kv_layout(spec: ModelShape) -> str:
    if spec.attention_kind == "mla":
        return f"MLA latent {spec.kv_lora_rank} + rope {spec.qk_rope_head_dim}, on every GPU"
    return f"{spec.num_kv_heads_per_rank} of {spec.num_kv_heads} KV heads per GPU"


def render_plan(spec: ModelShape, plan: Plan) -> None:
    """A table of the inputs and the resulting pools, then the verdict in words."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from hybridshared.units import format_gib, format_mib

    p = plan.pools
    table = Table(title=f"{spec.family} ({escape(spec.source)}), TP {spec.tp}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    if plan.gpu_mem_bytes:
        gpu = format_gib(plan.gpu_mem_bytes, 2)
    elif plan.engine == "builtin":
        gpu = "none: the bundled runtime on CPU"
    else:
        gpu = "not used (--pool-bytes given)"
    sizing = (
        f"SGLang {plan.sglang_release}'s ({plan.sizing_code})"
        if plan.engine == "sglang"
        else "the bundled runtime's own (runtime/engine/pool_setup.py)"
    )
    conv_dtype = plan.kv_dtype if plan.engine == "builtin" else spec.conv_dtype
    kv_total = f"; {plan.kv_bytes_per_token * spec.tp} B over all {spec.tp} GPUs" if spec.tp > 1 else ""
    rows = [
        ("engine / sizing", f"{plan.engine}: {sizing}"),
        (
            "layers",
            f"{spec.num_layers}: {spec.num_attn_layers} full attention, {spec.num_linear_layers} {spec.linear_kind}",
        ),
        ("GPU memory", gpu),
        ("mem_fraction_static", f"{plan.mem_fraction_static}"),
        ("weights per GPU", f"{format_gib(plan.weights_bytes, 2)} ({escape(plan.weights_source)})"),
        ("pool budget per GPU", f"{format_gib(plan.pool_bytes, 2)} ({escape(plan.pool_source)})"),
        (
            "state per request, per GPU",
            f"{format_mib(plan.mamba_state_bytes_per_request)} (SSM {plan.ssm_dtype}, conv "
            f"{conv_dtype}; conv {spec.conv_state_shape}, ssm {spec.ssm_state_shape})",
        ),
        (
            "KV per token, per GPU",
            f"{plan.kv_bytes_per_token} B ({plan.kv_dtype}, {_kv_layout(spec)}{kv_total})",
        ),
        ("radix strategy", escape(plan.strategy_reason)),
        ("overlap schedule", "on" if plan.overlap_schedule else "off"),
        ("slots per request", f"{p.slots_per_request}"),
        ("mamba_full_memory_ratio", f"{plan.mamba_full_memory_ratio}"),
        ("state slots (K)", f"{p.max_mamba_cache_size} (+1 padding; from {p.k_source})"),
        ("state pool per GPU", format_gib(p.mamba_pool_bytes, 2)),
        (
            "spec scratch",
            f"{format_gib(p.spec_intermediate_bytes, 2)} ({plan.speculative_num_draft_tokens} draft tokens)",
        ),
        ("KV tokens", f"{p.max_total_num_tokens} (page {plan.page_size})"),
        ("KV pool per GPU", format_gib(p.kv_pool_bytes, 2)),
        ("max running requests", f"{p.max_running_requests}"),
    ]
    for what, value in rows:
        table.add_row(what, value)
    console = Console(highlight=False, soft_wrap=True)
    console.print(table)
    console.print(f"[bold green]verdict:[/] {escape(plan.verdict)}")


# plan's own options, declared once here so the command's signature reads as a list of names.
_MODEL = typer.Option(None, "--model", help="Model directory or its config.json.")
_TP = typer.Option(None, "--tp", min=1, max=64, help="Tensor-parallel degree.")
_GPU_MEM_GIB = typer.Option(
    None, "--gpu-mem-gib", min=0.001, max=MAX_MEMORY_GIB, help="Memory of one GPU in GiB (default: detected with NVML)."
)
_MEMORY_BUDGET_GIB = typer.Option(
    None,
    "--memory-budget-gib",
    min=0.001,
    max=MAX_MEMORY_GIB,
    help="Bundled runtime: the memory it sizes its pools in, GiB (memory.memory_budget_gib; default 4 on CPU).",
)
_MEM_FRACTION_STATIC = typer.Option(
    None, "--mem-fraction-static", min=0.0, max=1.0, help="Fraction of GPU memory for weights + pools."
)
_MAMBA_FULL_MEMORY_RATIO = typer.Option(
    None, "--mamba-full-memory-ratio", min=0.0, max=10.0, help="State-pool bytes per KV-pool byte (SGLang: 0.9)."
)
_MAMBA_SSM_DTYPE = typer.Option(None, "--mamba-ssm-dtype", help="SSM state dtype: float32, bfloat16 or float16.")
_MAMBA_RADIX_CACHE_STRATEGY = typer.Option(
    None, "--mamba-radix-cache-strategy", help="auto, no_buffer, extra_buffer or extra_buffer_lazy."
)
_PAGE_SIZE = typer.Option(None, "--page-size", min=1, help="Tokens per KV page.")
_DISABLE_RADIX_CACHE = typer.Option(False, "--disable-radix-cache", help="Prefix cache off.")
_DISABLE_OVERLAP_SCHEDULE = typer.Option(
    False, "--disable-overlap-schedule", help="Turn off SGLang's overlap scheduler."
)
_SPECULATIVE_NUM_DRAFT_TOKENS = typer.Option(
    None, "--speculative-num-draft-tokens", min=0, help="Draft tokens per verify (0: no speculation)."
)
_MAX_RUNNING_REQUESTS = typer.Option(
    None, "--max-running-requests", min=1, help="Cap on concurrently running requests."
)
_POOL_BYTES = typer.Option(
    None, "--pool-bytes", min=1, max=MAX_MEMORY_BYTES, help="Bytes both pools share (skips the GPU/weights arithmetic)."
)
_POOL_GIB = typer.Option(None, "--pool-gib", min=0.0, max=MAX_MEMORY_GIB, help="Same as --pool-bytes, in GiB.")
_MAX_TOTAL_TOKENS = typer.Option(
    None, "--max-total-tokens", min=1, help="Cap on the KV pool in tokens (SGLang's --max-total-tokens)."
)
_ENGINE = typer.Option(
    None, "--engine", help="sglang or builtin: whose sizing (default: server.engine; auto as launch picks)."
)
_SGLANG_VERSION = typer.Option(
    None,
    "--sglang-version",
    help="Size as this SGLang release does (default: installed, else config, else newest).",
)
_JSON = json_option("the plan and the model spec")


@app.command("plan")
@takes_config_files()
def plan(
    files: ConfigFiles = NO_FILES,
    model: str | None = _MODEL,
    tp: int | None = _TP,
    gpu_mem_gib: float | None = _GPU_MEM_GIB,
    memory_budget_gib: float | None = _MEMORY_BUDGET_GIB,
    mem_fraction_static: float | None = _MEM_FRACTION_STATIC,
    mamba_full_memory_ratio: float | None = _MAMBA_FULL_MEMORY_RATIO,
    mamba_ssm_dtype: str | None = _MAMBA_SSM_DTYPE,
    mamba_radix_cache_strategy: str | None = _MAMBA_RADIX_CACHE_STRATEGY,
    page_size: int | None = _PAGE_SIZE,
    disable_radix_cache: bool = _DISABLE_RADIX_CACHE,
    disable_overlap_schedule: bool = _DISABLE_OVERLAP_SCHEDULE,
    speculative_num_draft_tokens: int | None = _SPECULATIVE_NUM_DRAFT_TOKENS,
    max_running_requests: int | None = _MAX_RUNNING_REQUESTS,
    pool_bytes: int | None = _POOL_BYTES,
    pool_gib: float | None = _POOL_GIB,
    max_total_tokens: int | None = _MAX_TOTAL_TOKENS,
    engine: str | None = _ENGINE,
    sglang_version: str | None = _SGLANG_VERSION,
    as_json: bool = _JSON,
) -> None:
    """Size the KV pool and the recurrent-state pool exactly as the engine will: the target SGLang release's
    sizing for engine sglang, the bundled runtime's own for engine builtin (auto: the engine launch picks here).

    Exit codes: 0 planned, 1 the pools do not fit (the message says what to change), 2 bad input.
    """
    from hybridctl.launch.plan import auto_engine_here

    engine_option(engine)

    from hybridctl.config.findings import ConfigError
    from hybridctl.planner.plan_request import PlanRequest, PlanRequestError, run_plan
    from hybridshared.model.errors import ModelShapeError
    from hybridshared.sizing.pool_sizing import PoolSizingError

    config, settings = files.config, files.settings  # None: ./config.toml if present
    req = PlanRequest(
        config_path=config,
        settings_path=settings,
        model=model,
        tp=tp,
        gpu_mem_gib=gpu_mem_gib,
        memory_budget_gib=memory_budget_gib,
        pool_bytes=pool_bytes,
        pool_gib=pool_gib,
        mem_fraction_static=mem_fraction_static,
        mamba_full_memory_ratio=mamba_full_memory_ratio,
        mamba_ssm_dtype=mamba_ssm_dtype,
        mamba_radix_cache_strategy=mamba_radix_cache_strategy,
        page_size=page_size,
        disable_radix_cache=disable_radix_cache,
        disable_overlap_schedule=disable_overlap_schedule,
        speculative_num_draft_tokens=speculative_num_draft_tokens,
        max_running_requests=max_running_requests,
        sglang_version=sglang_version,
        max_total_tokens=max_total_tokens,
        engine=engine,
        auto_engine=auto_engine_here(),
    )
    try:
        spec, result = run_plan(req)
    except PoolSizingError as exc:
        _does_not_fit(exc, as_json)
    except (PlanRequestError, ModelShapeError, ConfigError) as exc:
        raise fail(str(exc)) from None
    ignored = _ignored_options(result.engine, sglang_version, disable_overlap_schedule)
    if as_json:
        print_json({"fits": True, **result.to_dict(), "model": spec.to_dict(), "ignored_options": ignored})
        return
    if spec.stand_in_note():
        typer.echo(f"note: {spec.stand_in_note()}")
    for item in ignored:
        typer.echo(f"note: {item['option']} ignored: {item['reason']}", err=True)
    render_plan(spec, result)


def _ignored_options(engine: str, sglang_version: str | None, disable_overlap_schedule: bool) -> list[dict[str, str]]:
    """Options the chosen sizing has no use for: said, not silently dropped."""
    if engine != "builtin":
        return []
    why = "the bundled runtime's own sizing was used"
    given = (
        ("--sglang-version", sglang_version is not None, f"{why}, not an SGLang release's"),
        ("--disable-overlap-schedule", disable_overlap_schedule, f"{why}; it has no overlap schedule"),
    )
    return [{"option": flag, "reason": reason} for flag, on, reason in given if on]


def _does_not_fit(exc: Exception, as_json: bool) -> NoReturn:
    """Exit 1: the pools do not fit; the message says what to change."""
    if as_json:
        print_json({"fits": False, "error": str(exc)})
    else:
        typer.echo(f"does not fit: {exc}", err=True)
    raise typer.Exit(1) from None
