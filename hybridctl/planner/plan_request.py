"""What `hybridctl plan` asks for (files + flags) -> the ModelShape and the Plan, with every input resolved.

Precedence for each value: flag > config.toml / settings.json > SGLang's default. Config files are optional.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hybridctl.config.loader import load_hybrid_config, settings_path_for
from hybridctl.config.schema import HybridConfig
from hybridctl.host.nvml import gpu_free_bytes, gpu_memory_bytes
from hybridctl.model.bundled import load_model_shape_or_bundled
from hybridctl.planner.builtin_sizing import plan_builtin
from hybridctl.planner.plan import Plan, make_plan
from hybridshared import paths
from hybridshared.flags.engine_flags import DEFAULT_SGLANG_VERSION
from hybridshared.flags.sglang_version import VersionError, resolve_release
from hybridshared.model.shape import ModelShape
from hybridshared.sizing.pool_sizing import GIB, PoolSizingError


class PlanRequestError(ValueError):
    """An input is missing or contradictory; the message names the flag or key to set."""


@dataclass(frozen=True)
class PlanRequest:
    config_path: Path | None = None  # None: ./config.toml when it exists, else defaults
    settings_path: Path | None = None  # None: beside the config file
    model: str | None = None
    tp: int | None = None
    gpu_mem_gib: float | None = None
    pool_bytes: int | None = None
    pool_gib: float | None = None
    mem_fraction_static: float | None = None
    mamba_full_memory_ratio: float | None = None
    mamba_ssm_dtype: str | None = None
    mamba_radix_cache_strategy: str | None = None
    page_size: int | None = None
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    speculative_num_draft_tokens: int | None = None
    max_running_requests: int | None = None
    sglang_version: str | None = None  # --sglang-version: whose sizing code to follow
    max_total_tokens: int | None = None
    memory_budget_gib: float | None = None  # --memory-budget-gib: memory.memory_budget_gib, the runtime's budget
    engine: str | None = None  # sglang | builtin | auto; None: [server] engine
    auto_engine: str = "sglang"  # what "auto" means on this host (launch's choice)


def load_config(req: PlanRequest) -> tuple[HybridConfig, str | None]:
    """The config (or defaults) and the path it came from (None for defaults)."""
    config_path = req.config_path
    if config_path is None:
        config_path = Path("config.toml")
        if not config_path.is_file():
            return HybridConfig(), None
    elif not paths.is_file(config_path):
        problem = paths.lookup_problem(config_path)
        what = (
            f"cannot be read ({problem})"
            if problem
            else "is a directory, not a config file"
            if paths.is_dir(config_path)
            else "no such config file"
        )
        raise PlanRequestError(
            f"{config_path}: {what}. Omit the argument to plan with defaults, or run `hybridctl init` to write one."
        )

    settings_path = settings_path_for(config_path, req.settings_path)

    return load_hybrid_config(config_path, settings_path), str(config_path)


def _release(req: PlanRequest, cfg: HybridConfig) -> str:

    try:
        return resolve_release(req.sglang_version, cfg.config.server.sglang_version, DEFAULT_SGLANG_VERSION)[0]
    except VersionError as exc:
        raise PlanRequestError(f"--sglang-version: {exc}") from None


def _with_overrides(cfg: HybridConfig, req: PlanRequest) -> HybridConfig:
    """`cfg` with the flags that name config keys applied (for the bundled runtime, which reads only the config)."""
    out = cfg.model_copy(deep=True)
    mem, cache = out.config.memory, out.config.cache
    for owner, key, value in (
        (mem, "mem_fraction_static", req.mem_fraction_static),
        (mem, "mamba_full_memory_ratio", req.mamba_full_memory_ratio),
        (mem, "memory_budget_gib", req.memory_budget_gib),
        (cache, "mamba_radix_cache_strategy", req.mamba_radix_cache_strategy),
        (cache, "radix_cache_page_size", req.page_size),
        (out.settings.mamba, "state_dtype", req.mamba_ssm_dtype),
        (out.settings.runtime, "max_running_requests", req.max_running_requests),
    ):
        if value is not None:
            setattr(owner, key, value)
    if req.disable_radix_cache:
        out.settings.runtime.disable_radix_cache = True
    if req.max_total_tokens is not None:
        out.config.extra_engine_args["max-total-tokens"] = req.max_total_tokens
    return out


def recorded_gpu_mem_bytes(cfg: HybridConfig, engine: str) -> int | None:
    """memory.gpu_mem_gib (init --gpu-mem-gib): the server's GPU, for a host where NVML sees none. It sizes SGLang,
    and the bundled runtime when config.toml names it (written for it on that GPU); `auto` resolving to the runtime
    on a GPU-less host means the runtime on this CPU, which a GPU's size does not describe."""
    gib = cfg.config.memory.gpu_mem_gib
    if gib is None or (engine == "builtin" and cfg.config.server.engine != "builtin"):
        return None
    return int(gib * GIB)


def engine_for_planning(requested: str, auto_engine: str, gpu_size_given: bool) -> str:
    """The engine plan and doctor size for: `requested` unless auto; auto is SGLang when a GPU size was given
    (--gpu-mem-gib: the user plans a GPU server from here), else `auto_engine`, what launch picks on this host."""
    if requested != "auto":
        return requested
    return "sglang" if gpu_size_given else auto_engine


def plan_engine(cfg: HybridConfig, req: PlanRequest) -> str:
    """sglang or builtin: --engine, else [server] engine; auto is SGLang when a GPU size is given (--gpu-mem-gib,
    --pool-*: planning a GPU server), else what launch picks on this host."""
    sized_for_a_gpu = req.gpu_mem_gib is not None or req.pool_bytes is not None or req.pool_gib is not None
    return engine_for_planning(req.engine or cfg.config.server.engine, req.auto_engine, sized_for_a_gpu)


def run_plan(req: PlanRequest, *, detect_gpu_mem: bool = True) -> tuple[ModelShape, Plan]:
    """Resolve every input and plan with the sizing of the engine that would serve: SGLang's, or the bundled
    runtime's own. Raises PlanRequestError, ModelShapeError, ConfigError, PoolSizingError."""
    cfg, _ = load_config(req)
    model = req.model or cfg.config.server.model_path
    if not model:
        raise PlanRequestError(
            "No model to plan for: pass --model DIR_OR_CONFIG_JSON or set server.model_path in config.toml."
        )
    tp = req.tp or cfg.config.server.tp_size
    gpu_mem = int(req.gpu_mem_gib * GIB) if req.gpu_mem_gib is not None else None
    if plan_engine(cfg, req) == "builtin":
        if req.pool_bytes is not None or req.pool_gib is not None:
            raise PlanRequestError(
                "--pool-bytes/--pool-gib size SGLang's pools; the bundled runtime derives its budget from "
                "memory.memory_budget_gib (CPU) or --gpu-mem-gib (GPU). Drop them, or pass --engine sglang."
            )

        if gpu_mem is None and detect_gpu_mem:
            gpu_mem = gpu_free_bytes()  # on the GPU when there is one, sized from its free memory as the runtime
        if gpu_mem is None:
            gpu_mem = recorded_gpu_mem_bytes(cfg, "builtin")
        try:
            return plan_builtin(_with_overrides(cfg, req), model, gpu_mem_bytes=gpu_mem, tp=tp)
        except PoolSizingError as exc:
            if gpu_mem is not None or req.engine == "builtin" or cfg.config.server.engine == "builtin":
                raise
            raise PoolSizingError(
                f"{exc} (engine auto is the bundled runtime on this GPU-less host; to plan an SGLang server "
                "instead, pass --gpu-mem-gib, one GPU's memory, or --engine sglang with it)"
            ) from None
    if req.memory_budget_gib is not None:
        raise PlanRequestError(
            "--memory-budget-gib sizes the bundled runtime's budget; SGLang sizes its pools from the GPU's memory "
            "(--gpu-mem-gib). Drop it, or pass --engine builtin."
        )
    ssm_dtype = req.mamba_ssm_dtype or cfg.settings.mamba.state_dtype
    spec = load_model_shape_or_bundled(model, tp=tp, ssm_dtype=ssm_dtype)

    if req.pool_bytes is not None and req.pool_gib is not None:
        raise PlanRequestError("Give --pool-bytes or --pool-gib, not both.")
    pool = req.pool_bytes if req.pool_bytes is not None else None
    if req.pool_gib is not None:
        pool = int(req.pool_gib * GIB)
    if pool is None and gpu_mem is None and detect_gpu_mem:
        gpu_mem = gpu_memory_bytes()
    if pool is None and gpu_mem is None:
        gpu_mem = recorded_gpu_mem_bytes(cfg, "sglang")
    if pool is None and gpu_mem is None:
        raise PlanRequestError(
            "No GPU memory size: this machine has no GPU that NVML can see, and SGLang's pools depend on the "
            "GPU's memory. Pass --gpu-mem-gib (memory of one GPU of the server you plan for, e.g. 80 for an "
            "H100) or --pool-gib, or record it in config.toml (memory.gpu_mem_gib; init --gpu-mem-gib writes it); "
            "or plan the bundled runtime here with --engine builtin."
        )
    plan = make_plan(
        cfg,
        spec,
        gpu_mem_bytes=gpu_mem,
        pool_bytes=pool,
        mem_fraction_static=req.mem_fraction_static,
        mamba_full_memory_ratio=req.mamba_full_memory_ratio,
        strategy=req.mamba_radix_cache_strategy,
        page_size=req.page_size,
        disable_radix_cache=True if req.disable_radix_cache else None,
        overlap_schedule=not req.disable_overlap_schedule,
        speculative_num_draft_tokens=req.speculative_num_draft_tokens,
        max_running_requests=req.max_running_requests,
        sglang_version=_release(req, cfg),
        max_total_tokens=req.max_total_tokens,
    )
    return spec, plan
