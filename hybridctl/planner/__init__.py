"""Planning: split memory between the KV pool and the recurrent-state pool, exactly as SGLang 0.5.23 does."""

from hybridshared.sizing.pool_sizing import (
    PoolInputs,
    PoolPlan,
    PoolSizingError,
    StrategyResolution,
    resolve_strategy,
    size_pools,
    slots_per_request,
)

__all__ = [
    "PoolInputs",
    "PoolPlan",
    "PoolSizingError",
    "StrategyResolution",
    "resolve_strategy",
    "size_pools",
    "slots_per_request",
]
