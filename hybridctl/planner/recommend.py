"""`recommend`: starting values for a hybrid model on one GPU type, each with the reason it was chosen.

`hybridctl init` writes these into config.toml / settings.json. Every value is checked by running the same
`size_pools` the server uses, so the recommendation is a plan that fits, not a rule of thumb.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from hybridctl.planner.memory import (
    GpuTier,
    auto_mem_fraction_static,
    gpu_tier,
    pool_bytes_for,
    vlm_mem_fraction_factor,
)
from hybridshared.model.shape import ModelShape
from hybridshared.sizing.pool_sizing import (
    GIB,
    PoolInputs,
    PoolPlan,
    StrategyResolution,
    resolve_strategy,
    size_pools,
    slots_per_request,
)
from hybridshared.units import format_percent

# The most of the pool we hand to recurrent state when the target concurrency does not fit: r = 4 leaves 20%
# of the pool for KV, below which requests could not hold useful contexts anyway.
_MAX_RATIO = 4.0
_MIN_RATIO = 0.05
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9  # SGLang treats an unset --mamba-full-memory-ratio as 0.9
BUILTIN_MEM_FRACTION_STATIC = 0.85  # the schema's default: what the bundled runtime uses unless told otherwise


@dataclass(frozen=True)
class Recommended:
    value: Any
    reason: str


@dataclass(frozen=True)
class Recommendation:
    mem_fraction_static: Recommended
    mamba_full_memory_ratio: Recommended
    max_running_requests: Recommended
    chunked_prefill_size: Recommended
    mamba_radix_cache_strategy: Recommended
    page_size: Recommended
    pool_bytes: int  # per GPU, with the recommended mem_fraction_static
    pools: PoolPlan  # what the recommended values give

    def _items(self) -> dict[str, Recommended]:
        return {k: v for k, v in vars(self).items() if isinstance(v, Recommended)}

    @property
    def values(self) -> dict[str, Any]:
        """Field -> value; the field names are the config.toml / settings.json key names."""
        return {k: v.value for k, v in self._items().items()}

    @property
    def reasons(self) -> dict[str, str]:
        """Field -> why that value."""
        return {k: v.reason for k, v in self._items().items()}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fits(spec: ModelShape, pool: int, ratio: float, strategy: StrategyResolution, context_len: int) -> PoolPlan:
    return size_pools(
        PoolInputs(
            pool_bytes=pool,
            mamba_state_bytes_per_request=spec.mamba_state_bytes_per_request,
            kv_bytes_per_token=spec.kv_bytes_per_token,
            mamba_full_memory_ratio=ratio,
            strategy=strategy.strategy,
            overlap_schedule=strategy.overlap_schedule,
            context_len=context_len,
        )
    )


def recommend(
    spec: ModelShape,
    *,
    gpu_mem_bytes: int,
    tp: int,
    context_len: int | None = None,
    concurrency: int | None = None,
    engine: str = "sglang",
) -> Recommendation:
    """Values for a server that should hold `concurrency` requests of up to `context_len` tokens.

    context_len None: the model's. concurrency None: keep SGLang's default ratio (0.9) and report the request
    cap it gives. engine "builtin": the bundled CPU runtime (extra_buffer without an overlap schedule, no CUDA
    graphs or kernel workspace to reserve for: `gpu_mem_bytes` is its memory budget; fraction 0.85).

    Raises PoolSizingError (from pool_sizing) when the weights alone do not fit; the message suggests --tp.
    """
    if tp != spec.tp:
        raise ValueError(f"recommend: tp={tp} but the ModelShape was loaded for tp={spec.tp}; load it with tp={tp}")
    context_len = spec.context_len if context_len is None else context_len
    if (concurrency is not None and concurrency < 1) or context_len < 1:
        raise ValueError("recommend: concurrency and context_len must be >= 1")
    tier = gpu_tier(gpu_mem_bytes, tp)
    chunk = Recommended(tier.chunked_prefill_size, f"SGLang's default for a {tier.label} GPU (memory_hook.py tiers).")
    builtin = engine == "builtin"
    resolved, slots, strategy = _strategy(builtin)
    page = Recommended(1, "Token-granular prefix matches; SGLang's default (pages > 1 need extra_buffer).")
    mfs = _mem_fraction(spec, gpu_mem_bytes, tp, tier, concurrency, builtin)
    pool = pool_bytes_for(
        gpu_mem_bytes, mem_fraction_static=mfs.value, weights_bytes_per_rank=spec.weights_bytes_per_rank
    )
    if concurrency is None:
        ratio, running, plan = _keep_default_ratio(spec, pool, resolved, context_len)
    else:
        ratio, running, plan = _ratio_for_concurrency(spec, pool, resolved, slots, concurrency, context_len)
    return Recommendation(
        mem_fraction_static=mfs,
        mamba_full_memory_ratio=ratio,
        max_running_requests=running,
        chunked_prefill_size=chunk,
        mamba_radix_cache_strategy=strategy,
        page_size=page,
        pool_bytes=pool,
        pools=plan,
    )


def _strategy(builtin: bool) -> tuple[StrategyResolution, int, Recommended]:
    """The radix cache strategy each engine runs by default, and the state slots it costs per request."""
    # The bundled runtime treats auto as extra_buffer without overlap (runtime/engine/pool_setup.py).
    resolved = resolve_strategy("extra_buffer" if builtin else "auto", page_size=1, overlap_schedule=not builtin)
    slots = slots_per_request(
        disable_radix_cache=False, strategy=resolved.strategy, overlap_schedule=resolved.overlap_schedule
    )
    why = (
        "the bundled runtime checkpoints state every mamba_track_interval tokens and has no overlap schedule"
        if builtin
        else "what SGLang's auto picks with the overlap schedule on; it checkpoints state during decode so "
        "shared prefixes hit"
    )
    return (
        resolved,
        slots,
        Recommended(resolved.strategy, f"{why[0].upper()}{why[1:]}, at {slots} state slots per request."),
    )


def _mem_fraction(
    spec: ModelShape, gpu_mem_bytes: int, tp: int, tier: GpuTier, concurrency: int | None, builtin: bool
) -> Recommended:
    """mem_fraction_static: SGLang's automatic value (scaled down for a vision encoder); fixed for the runtime."""
    if builtin:
        return Recommended(
            BUILTIN_MEM_FRACTION_STATIC, "Bundled runtime: no CUDA graphs or kernel workspace to reserve memory for."
        )
    fraction = auto_mem_fraction_static(
        gpu_mem_bytes,
        tp=tp,
        chunked_prefill_size=tier.chunked_prefill_size,
        max_running_requests=concurrency,
        prefill_graph=spec.linear_kind != "kda",  # KDA turns the breakable prefill graph off
        mla=spec.attention_kind == "mla",
    )
    why = (
        f"SGLang's automatic value for {gpu_mem_bytes / GIB:.0f} GiB: the rest is reserved for "
        f"activations of a {tier.chunked_prefill_size}-token prefill chunk and CUDA graphs"
    )
    if spec.vit_num_layers is not None and spec.vit_hidden_size is not None:
        # SGLang keeps the unrounded product; three decimals, rounded down, never reserve less than it.
        fraction *= vlm_mem_fraction_factor(spec.vit_num_layers, spec.vit_hidden_size)
        fraction = math.floor(fraction * 1000) / 1000
        why += ", scaled down for the vision encoder"
    return Recommended(fraction, why + ".")


def _ratio_for_concurrency(
    spec: ModelShape, pool: int, resolved: StrategyResolution, slots: int, concurrency: int, context_len: int
) -> tuple[Recommended, Recommended, PoolPlan]:
    """The smallest ratio whose state pool holds `concurrency` requests (capped at _MAX_RATIO), and the cap."""
    per_req = spec.mamba_state_bytes_per_request
    state_needed = (concurrency * slots + 2) * per_req  # K slots + padding slot + one for float rounding
    if state_needed < pool:
        ratio = max(_MIN_RATIO, math.ceil(state_needed / (pool - state_needed) * 100) / 100)
    else:
        ratio = math.inf
    if ratio > _MAX_RATIO:
        ratio = _MAX_RATIO
    plan = _fits(spec, pool, ratio, resolved, context_len)
    while plan.max_running_requests < concurrency and ratio < _MAX_RATIO:
        # Float rounding in SGLang's GB arithmetic can leave K one slot short; nudge the ratio up.
        ratio = min(_MAX_RATIO, round(ratio + 0.01, 2))
        plan = _fits(spec, pool, ratio, resolved, context_len)

    state_gib = plan.mamba_pool_bytes / GIB
    kv_each = plan.max_total_num_tokens / max(1, plan.max_running_requests)
    if plan.max_running_requests >= concurrency:
        ratio_reason = (
            f"{plan.max_mamba_cache_size} state slots ({state_gib:.1f} GiB) = {concurrency} requests x "
            f"{slots} slots; the rest of the {pool / GIB:.1f} GiB pool goes to "
            f"{plan.max_total_num_tokens} KV tokens."
        )
        running = Recommended(concurrency, f"Your target; the state pool holds exactly that many ({slots} slots each).")
    else:
        share = _MAX_RATIO / (1 + _MAX_RATIO)
        ratio_reason = (
            f"{concurrency} concurrent requests do not fit: even giving state {format_percent(share)} of the pool "
            f"holds only {plan.max_running_requests}. Use mamba.state_dtype = 'bfloat16' (halves the "
            f"state) or more GPUs (--tp)."
        )
        running = Recommended(
            plan.max_running_requests, f"The most the state pool can hold; {concurrency} was asked for."
        )
    if kv_each < context_len:
        ratio_reason += (
            f" Each request gets about {kv_each:.0f} KV tokens on average, under the {context_len}-token "
            f"context: full-length requests will queue."
        )
    return Recommended(ratio, ratio_reason), running, plan


def _keep_default_ratio(
    spec: ModelShape, pool: int, resolved: StrategyResolution, context_len: int
) -> tuple[Recommended, Recommended, PoolPlan]:
    """No concurrency target: SGLang's default split, and the request cap it yields."""
    plan = _fits(spec, pool, DEFAULT_MAMBA_FULL_MEMORY_RATIO, resolved, context_len)
    kv_each = plan.max_total_num_tokens / max(1, plan.max_running_requests)
    ratio = Recommended(
        DEFAULT_MAMBA_FULL_MEMORY_RATIO,
        f"no --concurrency given, so SGLang's default: {plan.max_mamba_cache_size} state slots, "
        f"{plan.max_total_num_tokens} KV tokens.",
    )
    running = Recommended(
        plan.max_running_requests,
        f"What the default split holds ({plan.slots_per_request} state slots per request); "
        f"about {kv_each:.0f} KV tokens each.",
    )
    return ratio, running, plan
