"""`make_plan`: config + model -> how SGLang 0.5.23 will split one GPU's memory, with a verdict in words."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridctl.config.schema import HybridConfig
from hybridctl.planner.memory import pool_bytes_for
from hybridshared.flags.engine_flags import DEFAULT_SGLANG_VERSION, release_facts
from hybridshared.model.shape import ModelShape
from hybridshared.sizing.pool_sizing import (
    PoolInputs,
    PoolPlan,
    PoolSizingError,
    StrategyResolution,
    resolve_strategy,
    size_pools,
)
from hybridshared.sizing.release_sizing import ReleaseSizing, release_sizing
from hybridshared.units import format_number


def extra_int(cfg: HybridConfig, flag: str) -> int | None:
    value = cfg.config.extra_engine_args.get(flag, cfg.config.extra_engine_args.get(flag.replace("-", "_")))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def configured_context_len(cfg: HybridConfig) -> int | None:
    """--context-length from [extra_engine_args] (what `init --context-len` writes), else None."""
    return extra_int(cfg, "context-length")


@dataclass(frozen=True)
class Plan:
    """One GPU's memory as SGLang would lay it out. Byte counts are per GPU (rank)."""

    family: str
    model_source: str
    tp: int
    gpu_mem_bytes: int | None
    mem_fraction_static: float
    weights_bytes: int  # per rank
    weights_source: str
    pool_bytes: int
    pool_source: str  # "given" (--pool-bytes) | "derived" (gpu memory x fraction - weights)
    strategy: str
    strategy_reason: str
    overlap_schedule: bool
    page_size: int
    disable_radix_cache: bool
    mamba_full_memory_ratio: float
    speculative_num_draft_tokens: int
    ssm_dtype: str
    kv_dtype: str
    context_len: int
    mamba_state_bytes_per_request: int
    kv_bytes_per_token: int  # per GPU (rank); the whole server holds tp times this
    pools: PoolPlan
    sglang_release: str = DEFAULT_SGLANG_VERSION  # the release whose sizing code was followed
    sizing_code: str = "kv_cache_configurator"  # that release's sizing code family (release_sizing.py)
    engine: str = "sglang"  # whose sizing: sglang (SGLang 0.5.23's) | builtin (the bundled runtime's own)

    @property
    def tokens_per_request(self) -> float:
        return self.pools.max_total_num_tokens / max(1, self.pools.max_running_requests)

    @property
    def verdict(self) -> str:
        p = self.pools
        limiter = _LIMITERS.get(p.limited_by, p.limited_by)
        text = (
            f"{p.max_running_requests} concurrent requests (limited by {limiter}); "
            f"{_count(p.max_total_num_tokens)} KV tokens = {_count(self.tokens_per_request)} tokens each"
        )
        if self.tokens_per_request < self.context_len:
            text += f" (below the {_count(self.context_len)}-token context: long requests will queue)"
        return text + "."

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "family": self.family,
            "model_source": self.model_source,
            "tp": self.tp,
            "gpu_mem_bytes": self.gpu_mem_bytes,
            "mem_fraction_static": self.mem_fraction_static,
            "weights_bytes": self.weights_bytes,
            "weights_source": self.weights_source,
            "pool_bytes": self.pool_bytes,
            "pool_source": self.pool_source,
            "strategy": self.strategy,
            "strategy_reason": self.strategy_reason,
            "overlap_schedule": self.overlap_schedule,
            "page_size": self.page_size,
            "disable_radix_cache": self.disable_radix_cache,
            "mamba_full_memory_ratio": self.mamba_full_memory_ratio,
            "speculative_num_draft_tokens": self.speculative_num_draft_tokens,
            "ssm_dtype": self.ssm_dtype,
            "kv_dtype": self.kv_dtype,
            "context_len": self.context_len,
            "mamba_state_bytes_per_request": self.mamba_state_bytes_per_request,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token,
            "kv_bytes_per_token_total": self.kv_bytes_per_token * self.tp,
            "engine": self.engine,
            "tokens_per_request": round(self.tokens_per_request, 1),
            "verdict": self.verdict,
            "sglang_release": self.sglang_release,
            "sizing_code": self.sizing_code,
        }
        d.update(self.pools.to_dict())
        return d


_LIMITERS = {
    "state_pool": "the state pool",
    "requested": "max_running_requests (as set, or SGLang's 48 under speculative decoding)",
    "kv_tokens": "the KV pool",
    "estimate": "SGLang's KV-tokens-per-context estimate",
}


def _count(n: float) -> str:
    """A token count as "926.6 k", "2 M", "1.4 G" (one decimal, none when it is 0)."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{format_number(n / scale, digits=1)} {unit}"
    return f"{n:.0f}"


def make_plan(
    cfg: HybridConfig,
    spec: ModelShape,
    *,
    gpu_mem_bytes: int | None = None,
    pool_bytes: int | None = None,
    mem_fraction_static: float | None = None,
    mamba_full_memory_ratio: float | None = None,
    strategy: str | None = None,
    page_size: int | None = None,
    disable_radix_cache: bool | None = None,
    overlap_schedule: bool = True,
    speculative_num_draft_tokens: int | None = None,
    max_running_requests: int | None = None,
    max_mamba_cache_size: int | None = None,
    sglang_version: str | None = None,
    max_total_tokens: int | None = None,
) -> Plan:
    """Weights + reserve as SGLang's mem_fraction_static logic does, then `size_pools`.

    Keyword overrides win over `cfg` (they are the CLI flags). `pool_bytes` skips the device arithmetic; else
    `gpu_mem_bytes` (per GPU) is required. Raises PoolSizingError with the numbers and the key to change.
    """
    mem = cfg.config.memory
    cache = cfg.config.cache
    fraction = mem.mem_fraction_static if mem_fraction_static is None else mem_fraction_static
    ratio = mem.mamba_full_memory_ratio if mamba_full_memory_ratio is None else mamba_full_memory_ratio
    page = cache.radix_cache_page_size if page_size is None else page_size
    radix_off = (not cfg.prefix_cache_enabled) if disable_radix_cache is None else disable_radix_cache
    draft = _draft_tokens(cfg) if speculative_num_draft_tokens is None else speculative_num_draft_tokens
    max_running = cfg.settings.runtime.max_running_requests if max_running_requests is None else max_running_requests
    max_slots = mem.max_mamba_cache_size if max_mamba_cache_size is None else max_mamba_cache_size
    context_len = configured_context_len(cfg) or spec.context_len

    release = release_sizing(sglang_version or cfg.config.server.sglang_version)
    resolved = _strategy(cfg, spec, release, strategy, sglang_version, page, overlap_schedule, radix_off, draft)
    pool, pool_source = _pool_budget(spec, pool_bytes=pool_bytes, gpu_mem_bytes=gpu_mem_bytes, fraction=fraction)
    pools = size_pools(
        PoolInputs(
            pool_bytes=pool,
            mamba_state_bytes_per_request=spec.mamba_state_bytes_per_request,
            kv_bytes_per_token=spec.kv_bytes_per_token,
            page_size=page,
            mamba_full_memory_ratio=ratio,
            max_mamba_cache_size=max_slots,
            max_running_requests=max_running,
            disable_radix_cache=radix_off,
            strategy=resolved.strategy,
            overlap_schedule=resolved.overlap_schedule,
            speculative_num_draft_tokens=draft,
            context_len=context_len,
            max_total_tokens=max_total_tokens,
            release=release,
        )
    )
    return Plan(
        **_model_fields(spec),
        gpu_mem_bytes=gpu_mem_bytes,
        mem_fraction_static=fraction,
        pool_bytes=pool,
        pool_source=pool_source,
        strategy=resolved.strategy,
        strategy_reason=resolved.reason,
        overlap_schedule=resolved.overlap_schedule,
        page_size=page,
        disable_radix_cache=radix_off,
        mamba_full_memory_ratio=ratio,
        speculative_num_draft_tokens=draft,
        context_len=context_len,
        pools=pools,
        sglang_release=sglang_version or cfg.config.server.sglang_version or DEFAULT_SGLANG_VERSION,
        sizing_code=release.code,
    )


def _draft_tokens(cfg: HybridConfig) -> int:
    """Draft tokens per verify as the config sets them; 0 when speculative decoding is off."""
    return cfg.config.speculative.speculative_num_draft_tokens if cfg.speculative_enabled else 0


def _strategy(
    cfg: HybridConfig,
    spec: ModelShape,
    release: ReleaseSizing,
    strategy: str | None,
    sglang_version: str | None,
    page: int,
    overlap: bool,
    radix_off: bool,
    draft: int,
) -> StrategyResolution:
    """The radix-cache strategy (the override, else the config's; `auto` included) as the target release resolves
    it."""
    requested = cfg.config.cache.mamba_radix_cache_strategy if strategy is None else strategy
    if release.auto_strategy is not None:  # releases before 0.5.16: their own (simpler) strategy choice
        return _older_release_strategy(release, requested, overlap, radix_off, sglang_version, spec.architecture)
    return resolve_strategy(
        requested,
        page_size=page,
        overlap_schedule=overlap,
        disable_radix_cache=radix_off,
        speculative_num_draft_tokens=draft,
        mamba_track_interval=cfg.config.cache.mamba_track_interval,
        pd_disaggregation=cfg.config.pd.enable_pd_disaggregation,
    )


def _pool_budget(
    spec: ModelShape, *, pool_bytes: int | None, gpu_mem_bytes: int | None, fraction: float
) -> tuple[int, str]:
    """(bytes both pools share per GPU, "given" | "derived"): --pool-bytes as given, else GPU memory x fraction
    minus the weights."""
    if pool_bytes is not None:
        return pool_bytes, "given"
    if gpu_mem_bytes is not None:
        pool = pool_bytes_for(
            gpu_mem_bytes, mem_fraction_static=fraction, weights_bytes_per_rank=spec.weights_bytes_per_rank
        )
        return pool, "derived"
    raise ValueError("make_plan needs gpu_mem_bytes (per GPU) or pool_bytes")


def _model_fields(spec: ModelShape) -> dict[str, Any]:
    """What the plan takes from the model as it is."""
    return {
        "family": spec.family,
        "model_source": spec.source,
        "tp": spec.tp,
        "weights_bytes": spec.weights_bytes_per_rank,
        "weights_source": spec.weights_source,
        "ssm_dtype": spec.ssm_dtype,
        "kv_dtype": spec.kv_dtype,
        "mamba_state_bytes_per_request": spec.mamba_state_bytes_per_request,
        "kv_bytes_per_token": spec.kv_bytes_per_token,
    }


def _older_release_strategy(
    release: ReleaseSizing, requested: str, overlap: bool, radix_off: bool, version: str | None, arch: str
) -> StrategyResolution:
    """0.5.6 has no strategies (3 slots per request); 0.5.7 - 0.5.15 turn auto into no_buffer."""
    name = f"SGLang {version}" if version else f"SGLang's {release.code} releases"
    if radix_off:
        return StrategyResolution("no_buffer", overlap, "radix cache off: no state checkpoints are kept")
    if version and arch in release_facts(version).get("radix_cache_disables_overlap_for", []):
        # server_args.py of those releases: "Disabling overlap schedule since MambaRadixCache is not compatible"
        overlap = False
        name += f", which turns the overlap schedule off for {arch} with the radix cache,"
    if not release.strategies:
        return StrategyResolution("no_buffer", overlap, f"{name} has no radix-cache strategies (3 slots/request)")
    strategy = release.auto_strategy if requested == "auto" else requested
    if strategy not in release.strategies:
        raise PoolSizingError(
            f"{name} has no mamba radix-cache strategy {strategy!r} (it has {', '.join(release.strategies)}); "
            f'set cache.mamba_radix_cache_strategy = "extra_buffer" or target a newer release.'
        )
    why = f"auto -> {strategy} ({name})" if requested == "auto" else f"{strategy} (set explicitly)"
    return StrategyResolution(str(strategy), overlap, why)


# `hybridctl init` imports recommend from here, beside make_plan.
from hybridctl.planner.recommend import Recommendation, recommend  # noqa: E402

__all__ = ["Plan", "Recommendation", "make_plan", "recommend"]
