"""How the bundled runtime sizes its two pools: THE function it calls at start-up, and the planner's view of it.

`size_builtin_pools` is what runtime/engine/pool_setup.py runs (the runtime imports this torch-free module; the
control plane never imports the runtime). `plan_builtin` gives `plan`, `init` and `doctor` the same numbers from
the config alone, by computing the runtime's inputs the way it does: weights and activations (and so the KV cache
and the conv window) in the dtype `runtime_dtype` picks (`--dtype auto`: a bfloat16 checkpoint stays bfloat16, any
other is float32 on CPU; bfloat16 on a GPU), `auto` meaning extra_buffer, no
overlap schedule, one state slot per draft token under speculative decoding, and on CPU a memory budget of
memory.memory_budget_gib (default 4 GiB) instead of a device's memory.

The budget is an upper bound, not a target: after SGLang's split (`size_pools`), each pool is cut to what the
resolved request cap can use (`cap_to_need`): max_running_requests x context_len KV tokens, and state slots for
the running requests plus a checkpoint every mamba_track_interval tokens of that KV. SGLang fills a GPU on
purpose; a CPU process holding 4 GiB for an 11M-parameter model at 8 requests of 16k tokens holds memory nothing
can use. (The runtime also leaves the pools untouched until written: runtime/core/buffers.py.)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from hybridctl.model.dtypes import canonical_dtype, dtype_bytes
from hybridctl.planner.pool_sizing import PoolInputs, PoolPlan, PoolSizingError, resolve_strategy, size_pools
from hybridctl.planner.units import GIB

if TYPE_CHECKING:
    from hybridctl.config.schema import HybridConfig
    from hybridctl.model.spec import ModelSpec
    from hybridctl.planner.plan import Plan

DEFAULT_MEMORY_BUDGET_GIB = 4.0  # the runtime's memory on CPU unless --memory-budget-gib says otherwise
DEFAULT_MAMBA_TRACK_INTERVAL = 64  # runtime/core/config.py, when no --mamba-track-interval is given


@dataclass(frozen=True)
class BuiltinPools:
    plan: PoolPlan
    strategy: str  # resolved: no_buffer | extra_buffer
    strategy_reason: str
    pool_budget_bytes: int
    device_bytes: int
    # What `cap_to_need` cut (e.g. "KV tokens 926769 -> 131072"), "" when the budget was the smaller bound.
    capped_to_need: str = ""


def runtime_dtype(requested: str | None, stored: str | None, *, on_gpu: bool) -> str:
    """THE dtype the runtime holds the weights in and computes in (the KV cache and the conv window follow it; the
    SSM state has its own, --mamba-ssm-dtype). `requested` is --dtype (None or "auto": derive it), `stored` the
    checkpoint's (`checkpoint_dtype`).

    auto on CPU keeps a bfloat16 checkpoint in bfloat16, as SGLang and vLLM keep it on their devices: half the
    bytes a decode step reads, and prefill GEMMs on the CPU's bf16 matrix units (oneDNN). Any other checkpoint
    (float32; float16, whose CPU GEMMs have no matrix-unit path on most hosts; unknown) is held in float32, which
    is exact. On a GPU auto is bfloat16."""
    if requested not in (None, "auto"):
        return canonical_dtype(requested)
    if on_gpu:
        return "bfloat16"
    return "bfloat16" if stored == "bfloat16" else "float32"


def checkpoint_dtype(config_json: str | Path) -> str | None:
    """The dtype config.json says the weights are stored in (`torch_dtype`, transformers 5's `dtype`; a
    multimodal checkpoint's text_config first), canonical; None when it says none or the file is unreadable."""
    try:
        cfg = json.loads(Path(config_json).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    for part in (cfg.get("text_config"), cfg):
        if isinstance(part, dict):
            name = part.get("torch_dtype") or part.get("dtype")
            if isinstance(name, str):
                try:
                    return canonical_dtype(name)
                except ValueError:
                    return None
    return None


def runtime_strategy(
    requested: str, *, page_size: int, disable_radix_cache: bool, track_interval: int
) -> tuple[str, str]:
    """The runtime checkpoints states every mamba_track_interval tokens on every architecture, so `auto` means
    extra_buffer (SGLang's auto picks no_buffer without overlap and paging); it has no overlap schedule, so
    extra_buffer_lazy is refused."""
    if requested == "extra_buffer_lazy":
        raise PoolSizingError(
            "mamba_radix_cache_strategy extra_buffer_lazy needs the overlap schedule, which the bundled "
            'runtime does not have; use cache.mamba_radix_cache_strategy = "extra_buffer" (or "auto").'
        )
    resolved = resolve_strategy(
        "extra_buffer" if requested == "auto" else requested,
        page_size=page_size,
        overlap_schedule=False,
        disable_radix_cache=disable_radix_cache,
        mamba_track_interval=track_interval,
    )
    reason = "auto -> extra_buffer (the bundled runtime)" if requested == "auto" else resolved.reason
    return resolved.strategy, reason


def size_builtin_pools(
    *,
    device_bytes: int,
    mem_fraction_static: float,
    weight_bytes: int,
    state_bytes_per_request: int,
    kv_bytes_per_token: int,
    strategy: str = "auto",
    page_size: int = 1,
    mamba_track_interval: int = DEFAULT_MAMBA_TRACK_INTERVAL,
    mamba_full_memory_ratio: float = 0.9,
    max_mamba_cache_size: int | None = None,
    max_running_requests: int | None = None,
    disable_radix_cache: bool = False,
    context_len: int | None = None,
    max_total_tokens: int | None = None,
    speculative_num_draft_tokens: int = 0,
) -> BuiltinPools:
    """The bundled runtime's pools; raises PoolSizingError naming the key to change."""
    pool_budget = int(device_bytes * mem_fraction_static) - weight_bytes
    if pool_budget <= 0:
        raise PoolSizingError(
            f"The weights ({weight_bytes / GIB:.2f} GiB) do not fit in mem_fraction_static "
            f"({mem_fraction_static}) of the {device_bytes / GIB:.2f} GiB device memory; raise "
            f"memory.memory_budget_gib in config.toml (--memory-budget-gib of plan and of the runtime) or "
            f"memory.mem_fraction_static."
        )
    resolved, reason = runtime_strategy(
        strategy, page_size=page_size, disable_radix_cache=disable_radix_cache, track_interval=mamba_track_interval
    )
    plan = size_pools(
        PoolInputs(
            pool_bytes=pool_budget,
            mamba_state_bytes_per_request=state_bytes_per_request,
            kv_bytes_per_token=kv_bytes_per_token,
            page_size=page_size,
            mamba_full_memory_ratio=mamba_full_memory_ratio,
            max_mamba_cache_size=max_mamba_cache_size,
            max_running_requests=max_running_requests,
            disable_radix_cache=disable_radix_cache,
            strategy=resolved,
            overlap_schedule=False,
            context_len=context_len,
            max_total_tokens=max_total_tokens,
            speculative_num_draft_tokens=speculative_num_draft_tokens,
        )
    )
    # The runtime checkpoints prefill states every mamba_track_interval tokens with extra_buffer and the radix cache.
    interval = mamba_track_interval if resolved == "extra_buffer" and not disable_radix_cache else 0
    capped, what = cap_to_need(plan, state_bytes_per_request, kv_bytes_per_token, page_size, context_len, interval)
    return BuiltinPools(capped, resolved, reason, pool_budget, device_bytes, what)


def cap_to_need(
    plan: PoolPlan,
    state_bytes_per_request: int,
    kv_bytes_per_token: int,
    page_size: int,
    context_len: int | None,
    checkpoint_interval: int,
) -> tuple[PoolPlan, str]:
    """`plan` with each pool cut to what its request cap can use; the request cap itself is unchanged.

    KV tokens: max_running_requests x context_len, page aligned up (every running request at its longest; what
    running requests do not hold caches prefixes). State slots: max_running_requests x slots_per_request, plus
    one checkpoint every `checkpoint_interval` tokens of that KV (0: the runtime keeps no checkpoints), so every
    cached prefix can keep its states; unless the state pool set the request cap (K // ratio), when K is the need.
    Speculative scratch is sized from the request cap already. Returns the plan and what was cut ("": nothing)."""
    reqs, ratio = plan.max_running_requests, plan.slots_per_request
    tokens = plan.max_total_num_tokens
    if context_len is not None:
        tokens = min(tokens, -(-reqs * context_len // page_size) * page_size)
    k = plan.max_mamba_cache_size
    if plan.limited_by != "state_pool":
        checkpoints = -(-tokens // checkpoint_interval) if checkpoint_interval > 0 else 0
        k = min(k, reqs * ratio + checkpoints)
    if (k, tokens) == (plan.max_mamba_cache_size, plan.max_total_num_tokens):
        return plan, ""
    padding = plan.mamba_pool_bytes // state_bytes_per_request - plan.max_mamba_cache_size  # the padding slot
    cut = [
        f"{name} {old} -> {new}"
        for name, old, new in (
            ("state slots", plan.max_mamba_cache_size, k),
            ("KV tokens", plan.max_total_num_tokens, tokens),
        )
        if old != new
    ]
    return replace(
        plan,
        max_mamba_cache_size=k,
        mamba_pool_slots=k + 1,
        mamba_pool_bytes=(k + padding) * state_bytes_per_request,
        max_total_num_tokens=tokens,
        kv_pool_bytes=tokens * kv_bytes_per_token,
    ), ", ".join(cut)


def _extra_int(cfg: HybridConfig, flag: str) -> int | None:
    value = cfg.config.extra_engine_args.get(flag, cfg.config.extra_engine_args.get(flag.replace("-", "_")))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def configured_dtype(cfg: HybridConfig) -> str | None:
    """--dtype from [extra_engine_args], else None (auto)."""
    value = cfg.config.extra_engine_args.get("dtype")
    return value if isinstance(value, str) else None


def configured_context_len(cfg: HybridConfig) -> int | None:
    """--context-length from [extra_engine_args] (what `init --context-len` writes), else None."""
    return _extra_int(cfg, "context-length")


def builtin_model_spec(cfg: HybridConfig, model: str | Path, *, tp: int = 1, on_gpu: bool = False) -> ModelSpec:
    """The model as the bundled runtime holds it: weights, KV cache and conv window at `runtime_dtype`, the SSM
    state at settings.json mamba.state_dtype (runtime/engine/pool_setup.py)."""
    from dataclasses import replace

    from hybridctl.model.spec import load_model_spec

    spec = load_model_spec(model, tp=tp, ssm_dtype=cfg.settings.mamba.state_dtype)
    stored = checkpoint_dtype(spec.source)
    act = runtime_dtype(configured_dtype(cfg), stored, on_gpu=on_gpu)
    if act != spec.kv_dtype:
        spec = load_model_spec(model, tp=tp, ssm_dtype=cfg.settings.mamba.state_dtype, kv_dtype=act)
    act_b, ssm_b = dtype_bytes(act), dtype_bytes(spec.ssm_dtype)
    conv = math.prod(spec.conv_state_shape) * act_b
    ssm = math.prod(spec.ssm_state_shape) * ssm_b
    # Header bytes are at the stored dtype; a checkpoint that names none is taken as bfloat16, as most are.
    weights = spec.weights_bytes * act_b // dtype_bytes(stored or "bfloat16")
    return replace(
        spec,
        conv_dtype=act,
        conv_state_bytes=conv,
        ssm_state_bytes=ssm,
        mamba_state_bytes_per_request=spec.num_linear_layers * (conv + ssm),
        weights_bytes=weights,
        weights_bytes_per_rank=-(-weights // tp),
        weights_source=f"{spec.weights_source}, held in {act}",
    )


def runtime_device_bytes(memory_budget_gib: float | None, gpu_bytes: int | None) -> int:
    """The memory the runtime sizes from (its pools get mem_fraction_static of it, less the weights).

    GPU: `gpu_bytes`, the memory free before the weights load (SGLang's pre_model_load_memory: its pools get the
    memory free after loading less (1 - mem_fraction_static) of that), capped at memory_budget_gib when it is set;
    CPU (`gpu_bytes` None): memory_budget_gib, default 4 GiB."""
    budget = int(memory_budget_gib * GIB) if memory_budget_gib else None
    if gpu_bytes is not None:
        return gpu_bytes if budget is None else min(gpu_bytes, budget)
    return budget if budget is not None else int(DEFAULT_MEMORY_BUDGET_GIB * GIB)


def builtin_device_bytes(cfg: HybridConfig, gpu_mem_bytes: int | None) -> int:
    """The memory the runtime will size from for this config (`runtime_device_bytes`)."""
    return runtime_device_bytes(cfg.config.memory.memory_budget_gib, gpu_mem_bytes)


def plan_builtin(
    cfg: HybridConfig, model: str, *, gpu_mem_bytes: int | None = None, tp: int = 1
) -> tuple[ModelSpec, Plan]:
    """The bundled runtime's pools for `cfg` serving `model`, as it will size them at start-up.

    `gpu_mem_bytes`: plan for the runtime on a GPU of that size (bfloat16); None: on CPU, in
    memory.memory_budget_gib."""
    from hybridctl.planner.plan import Plan

    on_gpu = gpu_mem_bytes is not None
    spec = builtin_model_spec(cfg, model, tp=tp, on_gpu=on_gpu)
    act = spec.kv_dtype
    state, weights = spec.mamba_state_bytes_per_request, spec.weights_bytes_per_rank
    mem, cache, specu = cfg.config.memory, cfg.config.cache, cfg.config.speculative
    device = builtin_device_bytes(cfg, gpu_mem_bytes)
    draft = specu.speculative_num_steps + 1 if cfg.speculative_enabled else 0  # the runtime drafts a chain
    context_len = configured_context_len(cfg) or spec.context_len
    pools = size_builtin_pools(
        device_bytes=device,
        mem_fraction_static=mem.mem_fraction_static,
        weight_bytes=weights,
        state_bytes_per_request=state,
        kv_bytes_per_token=spec.kv_bytes_per_token,
        strategy=cache.mamba_radix_cache_strategy,
        page_size=cache.radix_cache_page_size,
        mamba_track_interval=cache.mamba_track_interval,
        mamba_full_memory_ratio=mem.mamba_full_memory_ratio,
        max_mamba_cache_size=mem.max_mamba_cache_size,
        max_running_requests=cfg.settings.runtime.max_running_requests,
        disable_radix_cache=not cfg.prefix_cache_enabled,
        context_len=context_len,
        max_total_tokens=_extra_int(cfg, "max-total-tokens"),
        speculative_num_draft_tokens=draft,
    )
    plan = Plan(
        family=spec.family,
        model_source=spec.source,
        tp=spec.tp,
        gpu_mem_bytes=gpu_mem_bytes,
        mem_fraction_static=mem.mem_fraction_static,
        weights_bytes=weights,
        weights_source=spec.weights_source,
        pool_bytes=pools.pool_budget_bytes,
        pool_source=("derived" if on_gpu else f"bundled runtime on CPU: {device / GIB:g} GiB budget")
        + (f"; cut to need: {pools.capped_to_need}" if pools.capped_to_need else ""),
        strategy=pools.strategy,
        strategy_reason=pools.strategy_reason,
        overlap_schedule=False,
        page_size=cache.radix_cache_page_size,
        disable_radix_cache=not cfg.prefix_cache_enabled,
        mamba_full_memory_ratio=mem.mamba_full_memory_ratio,
        speculative_num_draft_tokens=draft,
        ssm_dtype=spec.ssm_dtype,
        kv_dtype=act,
        context_len=context_len,
        mamba_state_bytes_per_request=state,
        kv_bytes_per_token=spec.kv_bytes_per_token,
        pools=pools.plan,
        engine="builtin",
    )
    return spec, plan
