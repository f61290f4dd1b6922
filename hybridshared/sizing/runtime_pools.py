"""How the bundled runtime sizes its two pools: THE function it calls at start-up (runtime/engine/pool_setup.py)
and that `plan`, `init` and `doctor` call for engine = "builtin" (hybridctl/planner/builtin_sizing.py).

The runtime's inputs to SGLang's split (`size_pools`): activations (and so the KV cache and the conv window) in
float32 on CPU and bfloat16 on a GPU, `auto` meaning extra_buffer, no overlap schedule, one state slot per draft
token under speculative decoding, and on CPU a memory budget (default 4 GiB) instead of a device's memory.

The budget is an upper bound, not a target: after SGLang's split, each pool is cut to what the resolved request
cap can use (`cap_to_need`): max_running_requests x context_len KV tokens, and state slots for the running
requests plus a checkpoint every mamba_track_interval tokens of that KV. SGLang fills a GPU on purpose; a CPU
process holding 4 GiB for an 11M-parameter model at 8 requests of 16k tokens holds memory nothing can use. (The
runtime also leaves the pools untouched until written: runtime/core/buffers.py.)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from hybridshared.model.dtypes import canonical_dtype, dtype_bytes
from hybridshared.sizing.pool_sizing import PoolInputs, PoolPlan, PoolSizingError, resolve_strategy, size_pools
from hybridshared.units import GIB

DEFAULT_MEMORY_BUDGET_GIB = 4.0  # the runtime's memory on CPU unless --memory-budget-gib says otherwise
# A state checkpoint every 64 prompt tokens (when no --mamba-track-interval is given) lets a request that shares a
# 2000-token document with an earlier one resume from token 1984 (warm TTFT ~0.07 of a cold 2048-token prompt;
# 128: ~0.13). The model writes checkpoints during the prefill forward, so a cold prompt pays only their slots, not
# time (docs/runtime-design.md). The price is state memory: one slot per 64 prompt tokens, evicted LRU.
DEFAULT_MAMBA_TRACK_INTERVAL = 64


@dataclass(frozen=True)
class RuntimePoolInputs:
    """Everything the bundled runtime's pool sizing reads, per rank. A config builds it (plan, init, doctor:
    hybridctl/planner/builtin_sizing.py) and so do the runtime's arguments at start-up
    (runtime/engine/pool_setup.py); `size_builtin_pools` is the one formula over it."""

    device_bytes: int  # the memory sized from (`runtime_device_bytes`)
    mem_fraction_static: float
    weight_bytes: int
    state_bytes_per_request: int  # every linear layer's conv + SSM state, as the runtime holds them
    kv_bytes_per_token: int
    strategy: str = "auto"  # as requested: auto | no_buffer | extra_buffer | extra_buffer_lazy
    page_size: int = 1
    mamba_track_interval: int = DEFAULT_MAMBA_TRACK_INTERVAL
    mamba_full_memory_ratio: float = 0.9
    max_mamba_cache_size: int | None = None
    max_running_requests: int | None = None
    disable_radix_cache: bool = False
    context_len: int | None = None
    max_total_tokens: int | None = None
    speculative_num_draft_tokens: int = 0  # tokens per verify; 0: speculative decoding off

    @property
    def pool_budget_bytes(self) -> int:
        """mem_fraction_static of the device, less the weights: what both pools share."""
        return int(self.device_bytes * self.mem_fraction_static) - self.weight_bytes


@dataclass(frozen=True)
class BuiltinPools:
    inputs: RuntimePoolInputs
    plan: PoolPlan
    strategy: str  # resolved: no_buffer | extra_buffer
    strategy_reason: str
    # What `cap_to_need` cut (e.g. "KV tokens 926769 -> 131072"), "" when the budget was the smaller bound.
    capped_to_need: str = ""


def runtime_state_bytes(
    conv_state_shape: tuple[int, ...], ssm_state_shape: tuple[int, ...], num_linear_layers: int, *, act: str, ssm: str
) -> tuple[int, int, int]:
    """(conv, SSM, all layers') state bytes of one request as the runtime holds them: the conv window at the
    activation dtype `act` (so a prompt computed in chunks is bit-identical to one computed at once), the SSM
    state at `ssm`."""
    conv = math.prod(conv_state_shape) * dtype_bytes(act)
    temporal = math.prod(ssm_state_shape) * dtype_bytes(ssm)
    return conv, temporal, num_linear_layers * (conv + temporal)


def runtime_dtype(requested: str | None, stored: str | None, *, on_gpu: bool) -> str:
    """THE dtype the runtime holds the weights in and computes in (the SSM state has its own, --mamba-ssm-dtype;
    the KV cache and the conv window `pool_dtype`). `requested` is --dtype (None or "auto": derive it), `stored`
    the checkpoint's (`checkpoint_dtype`).

    auto on CPU keeps a bfloat16 checkpoint in bfloat16, as SGLang and vLLM keep it on their devices: half the
    bytes a decode step reads, and prefill GEMMs on the CPU's bf16 matrix units (oneDNN). Any other checkpoint
    (float32; float16, whose CPU GEMMs have no matrix-unit path on most hosts; unknown) is held in float32, which
    is exact. On a GPU auto is bfloat16."""
    if requested not in (None, "auto"):
        return canonical_dtype(requested)
    if on_gpu:
        return "bfloat16"
    return "bfloat16" if stored == "bfloat16" else "float32"


def pool_dtype(compute: str, *, on_gpu: bool) -> str:
    """The KV cache's and the conv window's dtype: float32 on CPU whatever the weights are held in, `compute` on a
    GPU. On CPU the native decode step reads and writes fp32 pools beside bf16 weights, and the torch path converts
    at the pool's boundary (every pool write and read casts), so both paths share one cache; the bytes are the
    price, small next to a CPU's memory (a quarter of the layers hold KV in the hybrid families)."""
    return compute if on_gpu else "float32"


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


def size_builtin_pools(inputs: RuntimePoolInputs) -> BuiltinPools:
    """The bundled runtime's pools; raises PoolSizingError naming the key to change."""
    i = inputs
    pool_budget = i.pool_budget_bytes
    if pool_budget <= 0:
        raise PoolSizingError(
            f"The weights ({i.weight_bytes / GIB:.2f} GiB) do not fit in mem_fraction_static "
            f"({i.mem_fraction_static}) of the {i.device_bytes / GIB:.2f} GiB device memory; raise "
            f"memory.memory_budget_gib in config.toml (--memory-budget-gib of plan and of the runtime) or "
            f"memory.mem_fraction_static."
        )
    resolved, reason = runtime_strategy(
        i.strategy,
        page_size=i.page_size,
        disable_radix_cache=i.disable_radix_cache,
        track_interval=i.mamba_track_interval,
    )
    plan = size_pools(
        PoolInputs(
            pool_bytes=pool_budget,
            mamba_state_bytes_per_request=i.state_bytes_per_request,
            kv_bytes_per_token=i.kv_bytes_per_token,
            page_size=i.page_size,
            mamba_full_memory_ratio=i.mamba_full_memory_ratio,
            max_mamba_cache_size=i.max_mamba_cache_size,
            max_running_requests=i.max_running_requests,
            disable_radix_cache=i.disable_radix_cache,
            strategy=resolved,
            overlap_schedule=False,
            context_len=i.context_len,
            max_total_tokens=i.max_total_tokens,
            speculative_num_draft_tokens=i.speculative_num_draft_tokens,
        )
    )
    # The runtime checkpoints prefill states every mamba_track_interval tokens with extra_buffer and the radix cache.
    interval = i.mamba_track_interval if resolved == "extra_buffer" and not i.disable_radix_cache else 0
    capped, what = cap_to_need(
        plan, i.state_bytes_per_request, i.kv_bytes_per_token, i.page_size, i.context_len, interval
    )
    return BuiltinPools(i, capped, resolved, reason, what)


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


def runtime_device_bytes(memory_budget_gib: float | None, gpu_bytes: int | None) -> int:
    """The memory the runtime sizes from (its pools get mem_fraction_static of it, less the weights).

    GPU: `gpu_bytes`, the memory free before the weights load (SGLang's pre_model_load_memory: its pools get the
    memory free after loading less (1 - mem_fraction_static) of that), capped at memory_budget_gib when it is set;
    CPU (`gpu_bytes` None): memory_budget_gib, default 4 GiB."""
    budget = int(memory_budget_gib * GIB) if memory_budget_gib else None
    if gpu_bytes is not None:
        return gpu_bytes if budget is None else min(gpu_bytes, budget)
    return budget if budget is not None else int(DEFAULT_MEMORY_BUDGET_GIB * GIB)
