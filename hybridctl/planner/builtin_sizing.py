"""The bundled runtime's pools for a config, as it will size them at start-up: `plan_builtin` gives `plan`, `init`
and `doctor` the numbers of hybridshared/sizing/runtime_pools.py's `size_builtin_pools` (THE function the
runtime calls) from the config alone, computing the runtime's inputs the way it does: weights held at
`runtime_dtype`, the KV cache and the conv window at `pool_dtype`, memory.memory_budget_gib on CPU."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from hybridctl.model.bundled import load_model_shape_or_bundled
from hybridctl.planner.plan import Plan, configured_context_len, extra_int
from hybridshared.model.dtypes import dtype_bytes
from hybridshared.sizing.runtime_pools import (
    BuiltinPools,
    RuntimePoolInputs,
    checkpoint_dtype,
    pool_dtype,
    runtime_device_bytes,
    runtime_dtype,
    runtime_state_bytes,
    size_builtin_pools,
)
from hybridshared.units import GIB

if TYPE_CHECKING:
    from hybridctl.config.schema import HybridConfig
    from hybridshared.model.shape import ModelShape


def configured_dtype(cfg: HybridConfig) -> str | None:
    """--dtype from [extra_engine_args], else None (auto)."""
    value = cfg.config.extra_engine_args.get("dtype")
    return value if isinstance(value, str) else None


def builtin_model_shape(cfg: HybridConfig, model: str | Path, *, tp: int = 1, on_gpu: bool = False) -> ModelShape:
    """The model as the bundled runtime holds it: weights at `runtime_dtype`, KV cache and conv window at
    `pool_dtype`, the SSM state at settings.json mamba.state_dtype (runtime/engine/pool_setup.py)."""
    ssm_dtype = cfg.settings.mamba.state_dtype
    spec = load_model_shape_or_bundled(model, tp=tp, ssm_dtype=ssm_dtype)
    stored = checkpoint_dtype(spec.source)
    act = runtime_dtype(configured_dtype(cfg), stored, on_gpu=on_gpu)
    pools = pool_dtype(act, on_gpu=on_gpu)
    if pools != spec.kv_dtype:
        spec = load_model_shape_or_bundled(model, tp=tp, ssm_dtype=ssm_dtype, kv_dtype=pools)
    conv, ssm, per_request = runtime_state_bytes(
        spec.conv_state_shape, spec.ssm_state_shape, spec.num_linear_layers, act=pools, ssm=spec.ssm_dtype
    )
    # Header bytes are at the stored dtype; a checkpoint that names none is taken as bfloat16, as most are.
    weights = spec.weights_bytes * dtype_bytes(act) // dtype_bytes(stored or "bfloat16")
    return replace(
        spec,
        conv_dtype=pools,
        conv_state_bytes=conv,
        ssm_state_bytes=ssm,
        mamba_state_bytes_per_request=per_request,
        weights_bytes=weights,
        weights_bytes_per_rank=-(-weights // tp),
        weights_source=f"{spec.weights_source}, held in {act}",
    )


def builtin_device_bytes(cfg: HybridConfig, gpu_mem_bytes: int | None) -> int:
    """The memory the runtime will size from for this config (`runtime_device_bytes`)."""
    return runtime_device_bytes(cfg.config.memory.memory_budget_gib, gpu_mem_bytes)


def builtin_pool_inputs(cfg: HybridConfig, spec: ModelShape, gpu_mem_bytes: int | None) -> RuntimePoolInputs:
    """What the runtime launched from `cfg` will size its pools from (`spec`: `builtin_model_shape`'s)."""
    mem, cache, specu = cfg.config.memory, cfg.config.cache, cfg.config.speculative
    return RuntimePoolInputs(
        device_bytes=builtin_device_bytes(cfg, gpu_mem_bytes),
        mem_fraction_static=mem.mem_fraction_static,
        weight_bytes=spec.weights_bytes_per_rank,
        state_bytes_per_request=spec.mamba_state_bytes_per_request,
        kv_bytes_per_token=spec.kv_bytes_per_token,
        strategy=cache.mamba_radix_cache_strategy,
        page_size=cache.radix_cache_page_size,
        mamba_track_interval=cache.mamba_track_interval,
        mamba_full_memory_ratio=mem.mamba_full_memory_ratio,
        max_mamba_cache_size=mem.max_mamba_cache_size,
        max_running_requests=cfg.settings.runtime.max_running_requests,
        disable_radix_cache=not cfg.prefix_cache_enabled,
        context_len=configured_context_len(cfg) or spec.context_len,
        max_total_tokens=extra_int(cfg, "max-total-tokens"),
        # the runtime drafts a chain: one token per step, plus the verified one
        speculative_num_draft_tokens=specu.speculative_num_steps + 1 if cfg.speculative_enabled else 0,
    )


def plan_builtin(
    cfg: HybridConfig, model: str, *, gpu_mem_bytes: int | None = None, tp: int = 1
) -> tuple[ModelShape, Plan]:
    """The bundled runtime's pools for `cfg` serving `model`, as it will size them at start-up.

    `gpu_mem_bytes`: plan for the runtime on a GPU of that size (bfloat16); None: on CPU, in
    memory.memory_budget_gib."""
    on_gpu = gpu_mem_bytes is not None
    spec = builtin_model_shape(cfg, model, tp=tp, on_gpu=on_gpu)
    pools = size_builtin_pools(builtin_pool_inputs(cfg, spec, gpu_mem_bytes))
    return spec, _render(spec, pools, gpu_mem_bytes)


def _render(spec: ModelShape, pools: BuiltinPools, gpu_mem_bytes: int | None) -> Plan:
    """The sized pools as a `Plan` (what plan, init and doctor show), read from the inputs the formula took."""
    i = pools.inputs
    budget = "derived" if gpu_mem_bytes is not None else f"bundled runtime on CPU: {i.device_bytes / GIB:g} GiB budget"
    return Plan(
        family=spec.family,
        model_source=spec.source,
        tp=spec.tp,
        gpu_mem_bytes=gpu_mem_bytes,
        mem_fraction_static=i.mem_fraction_static,
        weights_bytes=i.weight_bytes,
        weights_source=spec.weights_source,
        pool_bytes=i.pool_budget_bytes,
        pool_source=budget + (f"; cut to need: {pools.capped_to_need}" if pools.capped_to_need else ""),
        strategy=pools.strategy,
        strategy_reason=pools.strategy_reason,
        overlap_schedule=False,
        page_size=i.page_size,
        disable_radix_cache=i.disable_radix_cache,
        mamba_full_memory_ratio=i.mamba_full_memory_ratio,
        speculative_num_draft_tokens=i.speculative_num_draft_tokens,
        ssm_dtype=spec.ssm_dtype,
        kv_dtype=spec.kv_dtype,
        context_len=i.context_len or spec.context_len,
        mamba_state_bytes_per_request=i.state_bytes_per_request,
        kv_bytes_per_token=i.kv_bytes_per_token,
        pools=pools.plan,
        engine="builtin",
    )
