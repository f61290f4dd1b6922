"""THE pool-sizing function: one memory budget -> recurrent-state slots, request cap and KV tokens.

A faithful transcription of SGLang 0.5.23 (paths under sglang/srt/):
- mem_cache/kv_cache_configurator.py:3229-3409 `_handle_max_mamba_cache` (slots K, spec scratch, the rest),
- mem_cache/kv_cache_configurator.py:3062-3088 `_calculate_mamba_ratio` (state slots per running request),
- mem_cache/kv_cache_configurator.py:3119-3172 `resolve_max_num_reqs` (the request cap),
- model_executor/pool_configurator.py:637-647 `DefaultPoolConfigurator.calculate_pool_sizes` (KV tokens).
SGLang does this arithmetic in float GB (bytes / 2**30); so do we, in the same order, so the integers match.
Pure Python: plan, init, doctor and the bundled runtime all call `size_pools`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hybridshared.sizing.release_sizing import KV_CACHE_CONFIGURATOR, ReleaseSizing
from hybridshared.units import GIB, MIB

STRATEGIES: tuple[str, ...] = ("no_buffer", "extra_buffer", "extra_buffer_lazy")

# kv_cache_configurator.py:227: base ratio of Mamba slots to running requests (radix cache on).
MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3
# arg_groups/speculative_hook.py:1086-1090: speculative decoding sets --max-running-requests 48 when unset.
SPEC_DEFAULT_MAX_RUNNING_REQUESTS = 48


class PoolSizingError(ValueError):
    """The budget cannot hold the pools; the message carries the numbers and the key to change."""


@dataclass(frozen=True)
class PoolInputs:
    pool_bytes: int  # memory for both pools (after weights and reserve)
    mamba_state_bytes_per_request: int
    kv_bytes_per_token: int
    page_size: int = 1
    mamba_full_memory_ratio: float = 0.9
    max_mamba_cache_size: int | None = None
    max_running_requests: int | None = None
    disable_radix_cache: bool = False
    strategy: str = "no_buffer"  # resolved: no_buffer | extra_buffer | extra_buffer_lazy
    overlap_schedule: bool = False
    speculative_num_draft_tokens: int = 0  # 0: speculative decoding off
    # Added: SGLang's request-cap estimate divides KV tokens by the context length
    # (kv_cache_configurator.py:3123); None skips that estimate (cap = KV tokens // 2, then the state pool).
    context_len: int | None = None
    # Added: a --max-total-tokens style cap on KV tokens (kv_cache_configurator.py:3090-3117).
    max_total_tokens: int | None = None
    # Added: which SGLang release's sizing code to follow (sizing/release_sizing.py); default the newest.
    release: ReleaseSizing = KV_CACHE_CONFIGURATOR


@dataclass(frozen=True)
class PoolPlan:
    max_mamba_cache_size: int  # K
    mamba_pool_slots: int  # K + 1 (padding slot)
    slots_per_request: int  # SGLang's ratio
    max_running_requests: int
    mamba_pool_bytes: int
    spec_intermediate_bytes: int
    max_total_num_tokens: int  # KV tokens, page aligned
    kv_pool_bytes: int
    # Added fields
    k_source: str  # how K was chosen: max_mamba_cache_size | max_running_requests | ratio | ratio_spec
    capped_by_mamba: bool  # the request cap came from the state pool, not the KV pool
    # What set max_running_requests: state_pool | requested (flag, or 48 under speculative decoding) |
    # kv_tokens (KV tokens // 2) | estimate (SGLang's KV tokens / context_len * 512, clamped to 2048..4096)
    limited_by: str
    kv_budget_bytes: int  # what was left for KV after the state pool and spec scratch

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def slots_per_request(
    *, disable_radix_cache: bool, strategy: str, overlap_schedule: bool, skip_decode_lock: bool = False
) -> int:
    """kv_cache_configurator.py:3062-3088 with allocation_sizing.py `get_mamba_tracking_slots`.

    Radix cache off: one slot per request. no_buffer: 3 (a request's own state, the prefix snapshot it was
    seeded from, and the one it leaves behind). extra_buffer: + 2 tracking slots with overlap, + 1 without;
    extra_buffer_lazy: + 1 (the second is allocated on demand).
    """
    if disable_radix_cache:
        return 1
    _check_strategy(strategy)
    base = MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO - (1 if skip_decode_lock else 0)
    if strategy == "extra_buffer_lazy":
        if not overlap_schedule:
            raise PoolSizingError(
                "mamba_radix_cache_strategy extra_buffer_lazy requires the overlap schedule; set "
                'mamba_radix_cache_strategy = "extra_buffer" or stop disabling the overlap schedule.'
            )
        return base + 1
    if strategy == "extra_buffer":
        return base + (2 if overlap_schedule else 1)
    return base + (1 if skip_decode_lock else 0)


def _check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise PoolSizingError(
            f"mamba_radix_cache_strategy {strategy!r} is not a resolved strategy; pass one of "
            f"{', '.join(STRATEGIES)} (resolve 'auto' with resolve_strategy first)."
        )


def _validate(inp: PoolInputs) -> None:
    if inp.mamba_state_bytes_per_request <= 0:
        raise PoolSizingError(
            f"mamba_state_bytes_per_request must be positive, got {inp.mamba_state_bytes_per_request}; "
            f"the model has no recurrent state to size."
        )
    if inp.kv_bytes_per_token < 0:
        raise PoolSizingError(f"kv_bytes_per_token must be >= 0, got {inp.kv_bytes_per_token}.")
    if inp.page_size < 1:
        raise PoolSizingError(f"page_size must be >= 1, got {inp.page_size} (key cache.radix_cache_page_size).")
    if inp.mamba_full_memory_ratio <= 0:
        raise PoolSizingError(
            f"mamba_full_memory_ratio must be > 0, got {inp.mamba_full_memory_ratio} "
            f"(key memory.mamba_full_memory_ratio; SGLang's default is 0.9)."
        )
    if inp.speculative_num_draft_tokens < 0:
        raise PoolSizingError("speculative_num_draft_tokens must be >= 0 (0 turns speculative decoding off).")
    for name in ("max_mamba_cache_size", "max_running_requests", "context_len", "max_total_tokens"):
        value = getattr(inp, name)
        if value is not None and value < 1:
            raise PoolSizingError(f"{name} must be >= 1 when set, got {value}.")


def size_pools(inputs: PoolInputs) -> PoolPlan:
    """Split `pool_bytes` between the recurrent-state pool and the KV pool exactly as SGLang 0.5.23 does."""
    inp = inputs
    _validate(inp)
    rel = inp.release
    ratio = _slot_ratio(inp)
    per_req = inp.mamba_state_bytes_per_request
    draft = inp.speculative_num_draft_tokens
    max_running = inp.max_running_requests
    if draft > 0 and max_running is None:
        max_running = SPEC_DEFAULT_MAX_RUNNING_REQUESTS
    rest_gb = inp.pool_bytes / GIB
    intermediate = 0
    if rel.spec_scratch == "per_running_request" and draft > 0:
        # model_runner_kv_cache_mixin.py: max_running x draft states, reserved before the slots are sized
        assert max_running is not None
        intermediate = per_req * max_running * draft
        rest_gb -= intermediate / GIB
    ratio_rest_gb = rest_gb if rel.ratio_budget_after_scratch else inp.pool_bytes / GIB
    k, k_source, intermediate = _state_slots(inp, ratio, max_running, ratio_rest_gb, intermediate)
    if rel.spec_scratch == "per_slot":
        intermediate = k * per_req * draft  # charged below with the slots, in one sum as model_runner.py does
    elif rel.spec_scratch == "per_capped_request":
        rest_gb -= intermediate / GIB
    mamba_pool_bytes, kv_budget = _kv_budget(inp, k, rest_gb, intermediate)
    tokens, profiled = _kv_tokens(inp, kv_budget)
    estimate_from = profiled if inp.release.request_cap == "as_given" else tokens
    max_reqs, limited_by = _max_running_requests(tokens, k, ratio, inp, estimate_from)
    return PoolPlan(
        max_mamba_cache_size=k,
        mamba_pool_slots=k + 1,
        slots_per_request=ratio,
        max_running_requests=max_reqs,
        mamba_pool_bytes=mamba_pool_bytes,
        spec_intermediate_bytes=intermediate,
        max_total_num_tokens=tokens,
        kv_pool_bytes=tokens * inp.kv_bytes_per_token,
        k_source=k_source,
        capped_by_mamba=limited_by == "state_pool",
        limited_by=limited_by,
        kv_budget_bytes=kv_budget,
    )


def _slot_ratio(inp: PoolInputs) -> int:
    """State slots per running request for the release's code."""
    if inp.release.strategies:
        return slots_per_request(
            disable_radix_cache=inp.disable_radix_cache,
            strategy=inp.strategy,
            overlap_schedule=inp.overlap_schedule,
        )
    # model_runner.py (0.5.6): MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO with the radix cache, else 1
    return 1 if inp.disable_radix_cache else MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO


def _state_slots(
    inp: PoolInputs, ratio: int, max_running: int | None, ratio_rest_gb: float, intermediate: int
) -> tuple[int, str, int]:
    """(K, how K was chosen, speculative scratch bytes): kv_cache_configurator.py:3303-3386. The scratch is
    returned as given unless the release sizes it from K (per_capped_request)."""
    rel = inp.release
    per_req = inp.mamba_state_bytes_per_request
    draft = inp.speculative_num_draft_tokens
    spec = draft > 0
    if inp.max_mamba_cache_size is not None and (rel.code != "model_runner" or inp.disable_radix_cache):
        # kv_cache_configurator.py:3303-3324 (0.5.6 honours it only with the radix cache off)
        k = inp.max_mamba_cache_size
        if spec and rel.spec_scratch == "per_capped_request":
            assert max_running is not None
            capped = min(max(1, max_running), k // ratio)
            intermediate = per_req * (capped + 1) * draft
        return k, "max_mamba_cache_size", intermediate
    if inp.disable_radix_cache and (max_running is not None or rel.radix_off_default_slots is not None):
        # kv_cache_configurator.py:3325-3344 (max_running includes speculative decoding's default of 48)
        slots = max(1, max_running) if max_running is not None else rel.radix_off_default_slots
        assert slots is not None  # the branch's condition
        k_source = "max_running_requests" if max_running is not None else "release_default"
        if spec and rel.spec_scratch == "per_capped_request":
            intermediate = per_req * (slots + 1) * draft
        return slots, k_source, intermediate
    # kv_cache_configurator.py:3345-3386: K so states (+ spec scratch) use r / (1 + r) of the budget.
    r = inp.mamba_full_memory_ratio
    budget_bytes = ratio_rest_gb * r / (1 + r) * GIB
    if rel.spec_scratch == "per_slot":  # model_runner.py (0.5.6): each slot carries its draft states
        return int(budget_bytes // per_req // (1 + draft)), "ratio", intermediate
    if rel.spec_scratch == "per_running_request":
        return int(budget_bytes // per_req), "ratio", intermediate
    if spec:
        assert max_running is not None
        k = int((budget_bytes - per_req * (1 + draft)) // (per_req * (1 + draft / ratio)))
        capped = min(max(1, max_running), k // ratio)
        return k, "ratio_spec", per_req * (capped + 1) * draft
    return int((budget_bytes - per_req) // per_req), "ratio", intermediate


def _kv_budget(inp: PoolInputs, k: int, rest_gb: float, intermediate: int) -> tuple[int, int]:
    """(state pool bytes, bytes left for KV) once K slots (and the scratch) are charged; refuses what cannot fit."""
    rel = inp.release
    per_req = inp.mamba_state_bytes_per_request
    if k <= 0:
        # kv_cache_configurator.py:3392-3402
        raise PoolSizingError(
            f"Not enough memory for the hybrid state cache: max_mamba_cache_size would be {k} "
            f"(pool budget {inp.pool_bytes / GIB:.2f} GiB, {per_req / MIB:.2f} MiB of state per request, "
            f"mamba_full_memory_ratio {inp.mamba_full_memory_ratio}). Raise memory.mem_fraction_static, "
            f"lower settings.json runtime.max_running_requests or the draft tokens, use "
            f'mamba.state_dtype = "bfloat16", or use more GPUs (server.tp_size; --tp of plan and init).'
        )
    # +1: the pool's padding slot (memory_pool.py), charged to the budget only by the configurator (0.5.16 on)
    mamba_pool_bytes = (k + (1 if rel.padding_slot_counted else 0)) * per_req
    rest_gb -= (mamba_pool_bytes + (intermediate if rel.spec_scratch == "per_slot" else 0)) / GIB
    if rest_gb <= 0:
        raise PoolSizingError(
            f"The state pool ({k + 1} slots x {per_req / MIB:.2f} MiB = "
            f"{mamba_pool_bytes / GIB:.2f} GiB) and speculative scratch ({intermediate / GIB:.2f} GiB) "
            f"leave nothing of the {inp.pool_bytes / GIB:.2f} GiB pool budget for the KV cache. "
            f"Lower memory.max_mamba_cache_size or runtime.max_running_requests, "
            f"or raise memory.mem_fraction_static."
        )
    return mamba_pool_bytes, int(rest_gb * GIB)


def _kv_tokens(inp: PoolInputs, kv_budget: int) -> tuple[int, int]:
    """(KV tokens, page aligned and capped; the tokens before either, which 0.5.6 estimates the request cap
    from): pool_configurator.py:637-647, then the --max-total-tokens cap (kv_cache_configurator.py:3090-3117)."""
    if inp.kv_bytes_per_token:
        tokens = kv_budget // inp.kv_bytes_per_token
    else:
        tokens = inp.max_total_tokens or inp.context_len or 0
    profiled = tokens
    tokens = tokens // inp.page_size * inp.page_size
    if inp.max_total_tokens is not None:
        tokens = min(tokens, inp.max_total_tokens // inp.page_size * inp.page_size)
    if tokens <= 0:
        raise PoolSizingError(
            f"Not enough memory for the KV cache: {kv_budget / MIB:.1f} MiB left after the state pool "
            f"holds no {inp.page_size}-token page at {inp.kv_bytes_per_token} bytes per token. Raise "
            f"memory.mem_fraction_static or lower memory.mamba_full_memory_ratio."
        )
    return tokens, profiled


def _max_running_requests(tokens: int, k: int, ratio: int, inp: PoolInputs, estimate_from: int) -> tuple[int, str]:
    """kv_cache_configurator.py:3119-3172 (`resolve_max_num_reqs`, one data-parallel worker)."""
    if inp.context_len is not None:
        estimated = max(min(int(estimate_from / inp.context_len * 512), 4096), 2048)
    else:
        estimated = 4096
    requested = inp.max_running_requests
    if requested is None and inp.speculative_num_draft_tokens > 0:
        requested = SPEC_DEFAULT_MAX_RUNNING_REQUESTS
    wanted, source = (max(1, requested), "requested") if requested is not None else (estimated, "estimate")
    cap = inp.release.request_cap
    if cap == "as_given":  # model_runner.py (0.5.6): the flag, else the estimate
        reqs, limited_by = wanted, source
    elif cap == "clamped_to_estimate" and requested is not None:  # kv_cache_mixin: min(flag, estimate)
        reqs, limited_by = (wanted, source) if wanted <= estimated else (estimated, "estimate")
    elif cap == "clamped_to_estimate":
        reqs, limited_by = (estimated, "estimate") if estimated <= tokens // 2 else (tokens // 2, "kv_tokens")
    else:
        reqs, limited_by = (wanted, source) if wanted <= tokens // 2 else (tokens // 2, "kv_tokens")
    mamba_cap = k // ratio
    if mamba_cap < reqs:
        reqs, limited_by = mamba_cap, "state_pool"
    if reqs <= 0 and limited_by == "kv_tokens":
        capped = " (capped by SGLang's --max-total-tokens)" if inp.max_total_tokens is not None else ""
        raise PoolSizingError(
            f"The KV cache is too small to serve any request: {tokens} KV tokens{capped}, and a request needs "
            f"at least 2. Raise max_total_tokens (or drop it), raise memory.mem_fraction_static, or lower "
            f"memory.mamba_full_memory_ratio."
        )
    if reqs <= 0:
        raise PoolSizingError(
            f"The hybrid state cache is too small to serve any request: {k} slots at {ratio} slots per "
            f"request. Raise memory.mamba_full_memory_ratio or memory.max_mamba_cache_size, use "
            f'mamba.state_dtype = "bfloat16", or raise memory.mem_fraction_static.'
        )
    return reqs, limited_by


@dataclass(frozen=True)
class StrategyResolution:
    strategy: str  # no_buffer | extra_buffer | extra_buffer_lazy
    overlap_schedule: bool  # after resolution (no_buffer turns it off)
    reason: str


def resolve_strategy(
    requested: str = "auto",
    *,
    page_size: int = 1,
    overlap_schedule: bool = True,
    disable_radix_cache: bool = False,
    supports_extra_buffer: bool = True,
    linear_attn_backend: str = "triton",
    speculative_num_draft_tokens: int = 0,
    mamba_track_interval: int = 256,
    pd_disaggregation: bool = False,
) -> StrategyResolution:
    """SGLang 0.5.23's --mamba-radix-cache-strategy resolution and checks.

    arg_groups/overrides.py:452-487 (`_mamba_radix_cache_resolution`: auto picks extra_buffer when overlap or
    paging wants it and the architecture + triton linear-attention backend support it, else no_buffer with the
    overlap schedule turned off) and arg_groups/mamba_hook.py:115-163 (the validations).
    `supports_extra_buffer`: all six supported families are in overrides.py:403-434
    (`_MAMBA_EXTRA_BUFFER_ARCHS`).
    """
    if disable_radix_cache:
        # overrides.py:471-472: nothing is resolved or validated; states are never checkpointed.
        return StrategyResolution("no_buffer", overlap_schedule, "radix cache off: no state checkpoints are kept")
    if requested not in ("auto", *STRATEGIES):
        raise PoolSizingError(
            f"mamba_radix_cache_strategy {requested!r} is not one of auto, {', '.join(STRATEGIES)} "
            f"(key cache.mamba_radix_cache_strategy)."
        )
    extra_ok = supports_extra_buffer and linear_attn_backend == "triton"
    if requested == "auto":
        if (overlap_schedule or page_size > 1) and extra_ok:
            why = "overlap schedule on" if overlap_schedule else f"page_size {page_size} > 1"
            strategy, reason = "extra_buffer", f"auto -> extra_buffer ({why}; the architecture supports it)"
        else:
            strategy, overlap_schedule = "no_buffer", False
            reason = "auto -> no_buffer (no overlap and page_size 1, or extra_buffer unsupported); overlap off"
    else:
        strategy, reason = requested, f"{requested} (set explicitly)"

    if strategy == "no_buffer":
        if page_size != 1:
            raise PoolSizingError(
                f"mamba_radix_cache_strategy no_buffer only supports page size 1, got {page_size}; set "
                f'cache.radix_cache_page_size = 1 or cache.mamba_radix_cache_strategy = "extra_buffer".'
            )
        if overlap_schedule:
            raise PoolSizingError(
                "mamba_radix_cache_strategy no_buffer does not support the overlap schedule; pass SGLang's "
                '--disable-overlap-schedule or use cache.mamba_radix_cache_strategy = "auto".'
            )
        return StrategyResolution(strategy, overlap_schedule, reason)

    if not extra_ok:
        raise PoolSizingError(
            f"{strategy} needs an architecture with extra_buffer support and the triton "
            f"linear-attention backend (got {linear_attn_backend!r}); "
            'use cache.mamba_radix_cache_strategy = "no_buffer".'
        )
    if strategy == "extra_buffer_lazy" and pd_disaggregation:
        raise PoolSizingError(
            "extra_buffer_lazy is unsupported under PD disaggregation; use "
            'cache.mamba_radix_cache_strategy = "extra_buffer".'
        )
    if strategy == "extra_buffer_lazy" and not overlap_schedule:
        raise PoolSizingError(
            "extra_buffer_lazy requires the overlap schedule; drop SGLang's --disable-overlap-schedule or use "
            'cache.mamba_radix_cache_strategy = "extra_buffer".'
        )
    if speculative_num_draft_tokens and mamba_track_interval < speculative_num_draft_tokens:
        raise PoolSizingError(
            f"cache.mamba_track_interval ({mamba_track_interval}) must be >= speculative_num_draft_tokens "
            f"({speculative_num_draft_tokens}) with {strategy}."
        )
    if mamba_track_interval % page_size != 0:
        raise PoolSizingError(
            f"cache.mamba_track_interval ({mamba_track_interval}) must be a multiple of the page size "
            f"({page_size}) with {strategy}."
        )
    return StrategyResolution(strategy, overlap_schedule, reason)
