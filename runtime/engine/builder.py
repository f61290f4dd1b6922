"""Building an engine in start-up order: model and tokenizer, pools, prefix cache, scheduler, speculative decoder,
model runner (and its compiled forwards); each step logs what SGLang logs at the same point.

`build_engine` returns the parts; `EngineCore` (engine_core.py) is the engine they make and what runs it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hybridshared.flags.flag_types import AUTO
from hybridshared.flags.runtime_args import (
    DEFAULT_CPU_DECODING_STEP_TOKENS,
    DEFAULT_CPU_MAX_PREFILL_TOKENS,
    DEFAULT_MAX_PREFILL_TOKENS,
)
from runtime.core.batch import ModelLayout
from runtime.core.config import EngineArgs
from runtime.core.speculative_config import SpecConfig, SpecConfigError
from runtime.engine.model_runner import ModelRunner
from runtime.engine.pool_setup import EngineStartupError, Pools, model_dtype, size_and_allocate
from runtime.kvcache.cache_manager import CacheManager
from runtime.kvcache.page_pool import KVPagePool
from runtime.kvcache.state_pool import StateSlotPool
from runtime.models.layers.state_checkpoints import supports_state_checkpoints
from runtime.scheduler.config import SchedulerConfig
from runtime.scheduler.scheduler import Scheduler
from runtime.scheduler.step_budget import describe_step_cap

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from runtime.engine.background_compile import BackgroundCompile
    from runtime.engine.compiled_extend import CompiledExtend
    from runtime.kvcache.elastic_pool import ElasticPool
    from runtime.models.base import HybridModel
    from runtime.speculative.worker import SpecDecoder

logger = logging.getLogger("runtime.engine")


@dataclass(eq=False, repr=False)  # an engine (EngineCore is one) is itself, not its parts' values
class EngineParts:
    args: EngineArgs  # the device resolved
    dtype: torch.dtype
    model: HybridModel
    weight_bytes: int
    tokenizer: Tokenizer | None
    pools: Pools
    elastic: ElasticPool | None
    cache: CacheManager
    scheduler: Scheduler
    spec: SpecDecoder | None
    runner: ModelRunner
    background_compile: BackgroundCompile | None = None  # --torch-compile-in-background, while and after it runs


def build_engine(args: EngineArgs) -> EngineParts:
    """Every part of an engine, or EngineStartupError naming the option to change."""
    _validate(args)
    spec_config = _spec_config(args)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = model_dtype(args)
    model, weight_bytes = _load_model(args, dtype)
    tokenizer = load_tokenizer(args.tokenizer_path or args.model_path)
    layout = model.layout()
    draft_tokens = spec_config.num_draft_tokens if spec_config else 0
    pools = size_and_allocate(args, layout, weight_bytes, dtype, draft_tokens)
    elastic = _elastic_pool(args, pools, layout, spec_config)
    cache = _cache_manager(args, pools)
    scheduler = _scheduler(args, pools, cache, model, tokenizer)
    if elastic is not None:
        _attach_elastic(elastic, args, pools, cache)
    spec = None
    if spec_config is not None:
        spec = _spec_decoder(spec_config, args, model, pools, cache, dtype)
        scheduler.spec = spec
    runner = ModelRunner(model, pools)
    _native_decode(runner, args, pools)
    background = None
    if args.enable_torch_compile:
        background = _compile_forwards(runner, args, pools, cache, spec_on=spec is not None)
    parts = EngineParts(args, dtype, model, weight_bytes, tokenizer, pools, elastic, cache, scheduler, spec, runner)
    parts.background_compile = background
    _log_started(parts)
    return parts


def load_tokenizer(path: str) -> Tokenizer | None:
    """The fast tokenizer from tokenizer.json, or None when the directory has none (token ids only)."""
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(file))


def checkpointing(cache: CacheManager, pools: Pools) -> bool:
    """Prefill checkpoints go into the prefix cache (radix cache on, extra_buffer strategy)."""
    return cache.caching and pools.strategy == "extra_buffer"


def _validate(args: EngineArgs) -> None:
    if args.page_size < 1:
        raise EngineStartupError(f"page_size must be >= 1, got {args.page_size} (--page-size).")
    if args.mamba_track_interval < 1 or args.mamba_track_interval % args.page_size:
        raise EngineStartupError(
            f"mamba_track_interval ({args.mamba_track_interval}) must be a positive multiple of page_size "
            f"({args.page_size}); set --mamba-track-interval accordingly."
        )
    if args.schedule_policy not in ("fcfs", "lpm"):
        raise EngineStartupError(
            f"schedule_policy {args.schedule_policy!r} is not implemented by the bundled runtime; use fcfs or lpm."
        )


def _spec_config(args: EngineArgs) -> SpecConfig | None:
    """The resolved speculative options (None: off); bad ones refuse to start, naming the key to change."""
    if args.speculative_algorithm in (None, "", "none", "NONE"):
        return None
    from runtime.speculative.setup import spec_config_from_args

    try:
        return spec_config_from_args(args)
    except SpecConfigError as exc:
        raise EngineStartupError(str(exc)) from None


def _load_model(args: EngineArgs, dtype: torch.dtype) -> tuple[HybridModel, int]:
    """The model on its device and its weights' bytes; a load error becomes a start-up refusal."""
    from runtime.models.errors import ModelLoadError
    from runtime.models.loader import load_model

    t0 = time.perf_counter()
    try:
        model = load_model(args.model_path, dtype=dtype, device=args.device)
    except ModelLoadError as exc:  # already one clear paragraph naming the file and the fix
        raise EngineStartupError(str(exc)) from None
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    logger.info(
        "Load weight end. type=%s, dtype=%s, mem usage=%.2f GB, elapsed=%.2f s",
        type(model).__name__,
        dtype,
        weight_bytes / (1 << 30),
        time.perf_counter() - t0,
    )
    return model, weight_bytes


def _elastic_pool(
    args: EngineArgs, pools: Pools, layout: ModelLayout, spec_config: SpecConfig | None
) -> ElasticPool | None:
    """The elastic pool over `pools`' bytes (runtime/kvcache/elastic_pool.py), or None when it is off."""
    if not args.enable_elastic_memory_pool:
        return None
    if spec_config is not None:
        raise EngineStartupError(
            "enable_elastic_memory_pool with speculative decoding: the draft state sandbox lives outside the "
            "elastic buffer; turn one of them off (--enable-elastic-memory-pool / --speculative-algorithm)."
        )
    from runtime.kvcache.elastic_pool import make_elastic

    pool_bytes = pools.plan.kv_pool_bytes + pools.plan.mamba_pool_bytes
    elastic, pools.buffers = make_elastic(
        pools.buffers, pool_bytes, layout, args.page_size, args.device, args.elastic_realloc_timeout_s
    )
    return elastic


def _cache_manager(args: EngineArgs, pools: Pools) -> CacheManager:
    return CacheManager(
        KVPagePool(pools.plan.max_total_num_tokens // args.page_size, args.page_size),
        StateSlotPool(pools.num_state_slots, pools.buffers),
        radix_enabled=not args.disable_radix_cache,
        dual_lru=args.dual_lru_eviction,
        snapshot_on_match=args.state_snapshot_on_match,
        copy_on_write=args.state_copy_on_write,
    )


def _scheduler(
    args: EngineArgs, pools: Pools, cache: CacheManager, model: HybridModel, tokenizer: Tokenizer | None
) -> Scheduler:
    return Scheduler(
        cache,
        SchedulerConfig(
            max_running_requests=pools.plan.max_running_requests,
            chunked_prefill_size=args.chunked_prefill_size if args.chunked_prefill_size > 0 else -1,
            context_len=pools.context_len,
            schedule_policy=args.schedule_policy,
            checkpoint_interval=args.mamba_track_interval if checkpointing(cache, pools) else 0,
            in_forward_checkpoints=supports_state_checkpoints(model),
            random_seed=args.random_seed,
            mixed_chunk=args.enable_mixed_chunk,
            decoding_step_tokens=decoding_step_tokens(args),
            decode_pause_target_s=args.decode_pause_target_ms / 1000 if pause_targeted(args) else 0.0,
            max_prefill_tokens=max_prefill_tokens(args),
        ),
        eos_token_ids=tuple(model.eos_token_ids),
        tokenizer=tokenizer,
        device=args.device,
    )


def _on_cpu(args: EngineArgs) -> bool:
    return torch.device(args.device).type == "cpu"


def pause_targeted(args: EngineArgs) -> bool:
    """Whether the cap on a step's tokens while requests decode follows decode_pause_target_ms."""
    steps = args.decoding_step_tokens
    return steps == AUTO or (steps is None and _on_cpu(args))


def decoding_step_tokens(args: EngineArgs) -> int:
    """The cap on a step's tokens while requests decode (EngineArgs.decoding_step_tokens resolved; 0: none); with
    a pause target, the cap until a prefill has been timed."""
    steps = args.decoding_step_tokens
    if isinstance(steps, int):
        return max(steps, 0)
    return DEFAULT_CPU_DECODING_STEP_TOKENS if pause_targeted(args) else 0


def max_prefill_tokens(args: EngineArgs) -> int:
    if args.max_prefill_tokens is not None:
        return args.max_prefill_tokens
    return DEFAULT_CPU_MAX_PREFILL_TOKENS if _on_cpu(args) else DEFAULT_MAX_PREFILL_TOKENS


def _attach_elastic(pool: ElasticPool, args: EngineArgs, pools: Pools, cache: CacheManager) -> None:
    """The elastic pool lays the cache's pools out over its chunks; the running cap then follows its split."""
    pool.attach(
        cache,
        initial_state_chunks=pools.num_state_slots,
        slots_per_request=max(1, pools.plan.slots_per_request),
        user_cap=args.max_running_requests,
    )
    logger.info(pool.describe())


def _spec_decoder(
    spec_config: SpecConfig, args: EngineArgs, model: HybridModel, pools: Pools, cache: CacheManager, dtype: torch.dtype
) -> SpecDecoder:
    from runtime.speculative.setup import build_spec_decoder

    try:
        return build_spec_decoder(
            spec_config,
            args,
            model,
            pools.buffers,
            sandbox_first_slot=pools.sandbox_first_slot,
            sandbox_slots=pools.sandbox_slots,
            max_running_requests=pools.plan.max_running_requests,
            token_capacity=pools.plan.max_total_num_tokens,
            cache=cache,
            dtype=dtype,
        )
    except SpecConfigError as exc:
        raise EngineStartupError(str(exc)) from None


def _compile_forwards(
    runner: ModelRunner, args: EngineArgs, pools: Pools, cache: CacheManager, spec_on: bool
) -> BackgroundCompile | None:
    """The runner's compiled decode and short extends (runtime/engine/compiled_*.py), warmed up now, or by a
    background thread while the engine serves eager (--torch-compile-in-background; returned, started)."""
    from runtime.engine.compiled_decode import CompiledDecode

    # Built here, on the engine's thread: each reads the torch thread count its graphs are compiled for. With the
    # native decode on, it runs every decode step: no decode graphs are compiled (minutes saved at start-up).
    decode = None if runner.native_decode is not None else CompiledDecode(runner.model, args.torch_compile_max_bs)
    extend = _compiled_extend(runner.model, args, pools, cache, spec_on)
    if args.torch_compile_in_background:
        from runtime.engine.background_compile import BackgroundCompile

        background = BackgroundCompile(runner, decode, extend, pools.buffers)
        background.start()
        return background
    if decode is not None:
        decode.warm_up(pools.buffers)
        runner.compiled_decode = decode
    if extend is not None and extend.warm_up(pools.buffers).enabled:
        runner.compiled_extend = extend
    return None


def _native_decode(runner: ModelRunner, args: EngineArgs, pools: Pools) -> None:
    """Install the native decode (--native-decode; runtime/engine/native_decode.py) where it applies, and log in one
    line which decode path runs and why; with `on`, refuse to start where it cannot."""
    from runtime.engine.native_decode import NativeStatus, native_decode_for

    native, status = native_decode_for(runner.model, args.native_decode, args.device)
    if native is not None:
        buffers = pools.buffers
        if reason := native.kernel.pools_error(buffers.k, buffers.v, buffers.conv, buffers.ssm):
            native, status = None, NativeStatus("off", reason)
    if native is None and args.native_decode == "on":
        raise EngineStartupError(f"--native-decode on, but it cannot run: {status.detail}; use auto or off.")
    runner.native_decode = native
    runner.native_status = "on" if native is not None else f"off: {status.detail}"
    logger.info(status.line())


def _compiled_extend(
    model: HybridModel, args: EngineArgs, pools: Pools, cache: CacheManager, spec_on: bool
) -> CompiledExtend | None:
    """The compiled short extends (runtime/engine/compiled_extend.py), not yet warmed up; None when off."""
    if args.torch_compile_max_extend_tokens <= 0:
        return None
    if spec_on:
        # The drafters read the target's hidden states from its eager forwards (runtime/speculative).
        logger.info("Torch compile: extends stay eager with speculative decoding.")
        return None
    from runtime.engine.compiled_extend import CompiledExtend

    return CompiledExtend(
        model,
        args.torch_compile_max_extend_tokens,
        cache.state_pool.copy,
        padding_slot=pools.num_state_slots,  # the pool's K + 1st slot, which no request gets
    )


def _log_started(parts: EngineParts) -> None:
    args, pools = parts.args, parts.pools
    plan = pools.plan
    radix = not args.disable_radix_cache
    logger.info(
        f"max_total_num_tokens={plan.max_total_num_tokens}, "
        f"chunked_prefill_size={args.chunked_prefill_size if args.chunked_prefill_size > 0 else -1}, "
        f"max_prefill_tokens={parts.scheduler.config.max_prefill_tokens}, "
        f"max_running_requests={plan.max_running_requests}, "
        f"context_len={pools.context_len}, available_cpu_mem={_available_mem_gb():.2f} GB"
    )
    sched = parts.scheduler
    cap = describe_step_cap(sched.config.decoding_step_tokens, sched.config.decode_pause_target_s)
    logger.info("Mixed chunk: %s, decoding_step_tokens=%s", sched.mixing, cap)
    logger.info(
        "Tree cache initialized: source=%s impl=%s hybrid_swa=%s hybrid_ssm=%s hicache_attached=%s "
        "mamba_radix_cache_strategy=%s mamba_track_interval=%s state_snapshot_on_match=%s "
        "state_copy_on_write=%s dual_lru_eviction=%s",
        "runtime",
        "StateAwareRadixCache" if radix else "ChunkCache",
        False,
        True,
        False,
        pools.strategy if radix else "none",
        args.mamba_track_interval if checkpointing(parts.cache, pools) else 0,
        args.state_snapshot_on_match,
        args.state_copy_on_write,
        args.dual_lru_eviction,
    )


def _available_mem_gb() -> float:
    try:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / (1 << 30)
    except (ValueError, OSError, AttributeError):
        return 0.0
