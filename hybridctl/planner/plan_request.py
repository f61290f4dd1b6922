"""What `hybridctl plan` asks for (files + flags) -> the ModelSpec and the Plan, with every input resolved.

Precedence for each value: flag > config.toml / settings.json > SGLang's default. Config files are optional.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hybridctl.config.schema import HybridConfig
from hybridctl.model.spec import ModelSpec, load_model_spec
from hybridctl.planner.plan import Plan, make_plan
from hybridctl.planner.pool_sizing import GIB


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
    sglang_version: str | None = None  # --sglang-version (issue 20): whose sizing code to follow


def load_config(req: PlanRequest) -> tuple[HybridConfig, str | None]:
    """The config (or defaults) and the path it came from (None for defaults)."""
    config_path = req.config_path
    if config_path is None:
        config_path = Path("config.toml")
        if not config_path.is_file():
            return HybridConfig(), None
    elif not config_path.is_file():
        what = "is a directory, not a config file" if config_path.is_dir() else "no such config file"
        raise PlanRequestError(
            f"{config_path}: {what}. Omit the argument to plan with defaults, or run `hybridctl init` to write one."
        )
    from hybridctl.config.loader import load_hybrid_config, settings_path_for

    settings_path = settings_path_for(config_path, req.settings_path)

    return load_hybrid_config(config_path, settings_path), str(config_path)


def _release(req: PlanRequest, cfg: HybridConfig) -> str:
    from hybridctl.config.engine_flags import DEFAULT_SGLANG_VERSION
    from hybridctl.config.sglang_version import VersionError, resolve_release

    try:
        return resolve_release(req.sglang_version, cfg.config.server.sglang_version, DEFAULT_SGLANG_VERSION)[0]
    except VersionError as exc:
        raise PlanRequestError(f"--sglang-version: {exc}") from None


def run_plan(req: PlanRequest, *, detect_gpu_mem: bool = True) -> tuple[ModelSpec, Plan]:
    """Resolve every input and plan. Raises PlanRequestError, ModelSpecError, ConfigError, PoolSizingError."""
    cfg, _ = load_config(req)
    model = req.model or cfg.config.server.model_path
    if not model:
        raise PlanRequestError(
            "No model to plan for: pass --model DIR_OR_CONFIG_JSON or set server.model_path in config.toml."
        )
    tp = req.tp or cfg.config.server.tp_size
    ssm_dtype = req.mamba_ssm_dtype or cfg.settings.mamba.state_dtype
    spec = load_model_spec(model, tp=tp, ssm_dtype=ssm_dtype)

    if req.pool_bytes is not None and req.pool_gib is not None:
        raise PlanRequestError("Give --pool-bytes or --pool-gib, not both.")
    pool = req.pool_bytes if req.pool_bytes is not None else None
    if req.pool_gib is not None:
        pool = int(req.pool_gib * GIB)
    gpu_mem = int(req.gpu_mem_gib * GIB) if req.gpu_mem_gib is not None else None
    if pool is None and gpu_mem is None and detect_gpu_mem:
        from hybridctl.host.nvml import gpu_memory_bytes

        gpu_mem = gpu_memory_bytes()
    if pool is None and gpu_mem is None:
        raise PlanRequestError(
            "No GPU memory size: NVML found no GPU on this machine. Pass --gpu-mem-gib (memory of one GPU, "
            "e.g. 80 for an H100) or --pool-gib (the memory both pools share, after weights)."
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
    )
    return spec, plan
