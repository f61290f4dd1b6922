"""The engine in one object, single-threaded: model + tokenizer + pools + prefix cache + scheduler.

`EngineCore.step()` runs one scheduler step. The threaded client (engine_thread.py) drives it for the server;
tests drive it directly, in-process.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from runtime.core.batch import ModelLayout
from runtime.core.config import EngineArgs
from runtime.core.requests import EngineStats
from runtime.core.spec_config import SpecConfig, SpecConfigError
from runtime.engine.model_runner import ModelRunner
from runtime.engine.pool_setup import EngineStartupError, Pools, resolve_torch_dtype, size_and_allocate
from runtime.kvcache.cache_manager import CacheManager
from runtime.kvcache.page_pool import KVPagePool
from runtime.kvcache.state_pool import StateSlotPool
from runtime.models.layers.state_checkpoints import supports_state_checkpoints
from runtime.scheduler.scheduler import Scheduler, SchedulerConfig

if TYPE_CHECKING:
    from runtime.engine.compiled_extend import CompiledExtend
    from runtime.kvcache.elastic_pool import ElasticPool
    from runtime.models.base import HybridModel
    from runtime.spec.worker import SpecDecoder

logger = logging.getLogger("runtime.engine")

DEFAULT_MAX_PREFILL_TOKENS = 16384  # SGLang's --max-prefill-tokens default


def load_tokenizer(path: str) -> Any | None:
    """The fast tokenizer from tokenizer.json, or None when the directory has none (token ids only)."""
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(file))


class EngineCore:
    def __init__(self, args: EngineArgs) -> None:
        """Build the engine in start-up order: model, pools, cache, scheduler, speculative decoder, compiled
        forwards; each step logs what SGLang logs at the same point."""
        _validate(args)
        spec_config = _spec_config(args)
        if args.device == "auto":
            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.args = args
        self.dtype = resolve_torch_dtype(args.dtype, args.device)
        self.model, self.weight_bytes = _load_model(args, self.dtype)
        self.tokenizer = load_tokenizer(args.tokenizer_path or args.model_path)
        layout = self.model.layout()
        draft_tokens = spec_config.num_draft_tokens if spec_config else 0
        self.pools: Pools = size_and_allocate(args, layout, self.weight_bytes, self.dtype, draft_tokens)
        self.elastic = _elastic_pool(args, self.pools, layout, spec_config)
        self.context_len = self.pools.context_len
        self.cache = _cache_manager(args, self.pools)
        self.max_prefill_tokens = DEFAULT_MAX_PREFILL_TOKENS
        self.scheduler = self._build_scheduler()
        if self.elastic is not None:
            self._attach_elastic(self.elastic)
        self.spec = None
        if spec_config is not None:
            self.spec = self._build_spec(spec_config)
            self.scheduler.spec = self.spec
        self.runner = ModelRunner(self.model, self.pools)
        if args.enable_torch_compile:
            self._compile_forwards(args)
        self._log_started()

    @property
    def _checkpointing(self) -> bool:
        """Prefill checkpoints go into the prefix cache (radix cache on, extra_buffer strategy)."""
        return self.cache.caching and self.pools.strategy == "extra_buffer"

    def _build_scheduler(self) -> Scheduler:
        args, plan = self.args, self.pools.plan
        return Scheduler(
            self.cache,
            SchedulerConfig(
                max_running_requests=plan.max_running_requests,
                chunked_prefill_size=args.chunked_prefill_size if args.chunked_prefill_size > 0 else -1,
                context_len=self.context_len,
                schedule_policy=args.schedule_policy,
                checkpoint_interval=args.mamba_track_interval if self._checkpointing else 0,
                in_forward_checkpoints=supports_state_checkpoints(self.model),
                random_seed=args.random_seed,
            ),
            eos_token_ids=tuple(self.model.eos_token_ids),
            tokenizer=self.tokenizer,
            device=args.device,
        )

    def _build_spec(self, spec_config: SpecConfig) -> SpecDecoder:
        from runtime.spec.setup import build_spec_decoder

        plan = self.pools.plan
        try:
            return build_spec_decoder(
                spec_config,
                self.args,
                self.model,
                self.pools,
                max_running_requests=plan.max_running_requests,
                token_capacity=plan.max_total_num_tokens,
                cache=self.cache,
                dtype=self.dtype,
            )
        except SpecConfigError as exc:
            raise EngineStartupError(str(exc)) from None

    def _log_started(self) -> None:
        args, plan = self.args, self.pools.plan
        radix = not args.disable_radix_cache
        logger.info(
            f"max_total_num_tokens={plan.max_total_num_tokens}, "
            f"chunked_prefill_size={args.chunked_prefill_size if args.chunked_prefill_size > 0 else -1}, "
            f"max_prefill_tokens={self.max_prefill_tokens}, "
            f"max_running_requests={plan.max_running_requests}, "
            f"context_len={self.context_len}, available_cpu_mem={_available_mem_gb():.2f} GB"
        )
        logger.info(
            "Tree cache initialized: source=%s impl=%s hybrid_swa=%s hybrid_ssm=%s hicache_attached=%s "
            "mamba_radix_cache_strategy=%s mamba_track_interval=%s state_snapshot_on_match=%s "
            "state_copy_on_write=%s dual_lru_eviction=%s",
            "runtime",
            "StateAwareRadixCache" if radix else "ChunkCache",
            False,
            True,
            False,
            self.pools.strategy if radix else "none",
            args.mamba_track_interval if self._checkpointing else 0,
            args.state_snapshot_on_match,
            args.state_copy_on_write,
            args.dual_lru_eviction,
        )

    def _attach_elastic(self, pool: ElasticPool) -> None:
        """The elastic pool takes over the cache's pools; the running cap then follows its split each step."""
        plan = self.pools.plan
        pool.attach(
            self.cache,
            initial_state_chunks=self.pools.num_state_slots,
            slots_per_request=max(1, plan.slots_per_request),
            user_cap=self.args.max_running_requests,
        )
        logger.info(pool.describe())

    def _compile_forwards(self, args: EngineArgs) -> None:
        """The runner's compiled decode and short extends, warmed up (runtime/engine/compiled_*.py)."""
        from runtime.engine.compiled_decode import CompiledDecode

        self.runner.compiled_decode = CompiledDecode(self.model, args.torch_compile_max_bs)
        self.runner.compiled_decode.warm_up(self.pools.buffers)
        self.runner.compiled_extend = self._compiled_extend(args)

    def _compiled_extend(self, args: EngineArgs) -> CompiledExtend | None:
        """The compiled short extends (runtime/engine/compiled_extend.py), warmed up; None when off."""
        if args.torch_compile_max_extend_tokens <= 0:
            return None
        if self.spec is not None:
            # The drafters read the target's hidden states from its eager forwards (runtime/spec).
            logger.info("Torch compile: extends stay eager with speculative decoding.")
            return None
        from runtime.engine.compiled_extend import CompiledExtend

        compiled = CompiledExtend(
            self.model,
            args.torch_compile_max_extend_tokens,
            self.cache.state_pool.copy,
            padding_slot=self.pools.num_state_slots,  # the pool's K + 1st slot, which no request gets
        )
        return compiled if compiled.warm_up(self.pools.buffers).enabled else None

    def step(self) -> bool:
        """One engine step: schedule → run → postprocess. False when there was nothing to do."""
        sched = self.scheduler
        if self.elastic is not None:
            sched.set_running_cap(self.elastic.rebalance(sched.waiting, len(sched.running)))
        batch = sched.schedule()
        if batch is None:
            return False
        try:
            logits = self.runner.run(batch)
        except BaseException:
            sched.abandon(batch)
            raise
        sched.postprocess(batch, logits)
        return True

    def check_invariants(self) -> None:
        """Pool accounting (free + cached + in-use == total, nothing in two places); raises AssertionError."""
        if self.elastic is not None:
            # Under the elastic pool, page and slot ids live in movable chunks, not 0..n-1: its own check (every
            # chunk KV or state, every page/slot of a chunk free, cached or held exactly once) replaces the
            # fixed split's.
            self.cache.tree.check_invariants()
            self.elastic.check_invariants()
            return
        self.scheduler.check_invariants()

    def stats(self) -> EngineStats:
        s = self.scheduler.stats()
        plan = self.pools.plan
        s.max_total_num_tokens = plan.max_total_num_tokens
        s.max_mamba_cache_size = plan.max_mamba_cache_size
        s.max_running_requests = plan.max_running_requests
        s.context_len = self.context_len
        s.page_size = self.args.page_size
        s.chunked_prefill_size = self.scheduler.config.chunked_prefill_size
        s.max_prefill_tokens = self.max_prefill_tokens
        s.radix_cache_enabled = not self.args.disable_radix_cache
        s.mamba_radix_cache_strategy = self.pools.strategy
        s.mamba_track_interval = self.scheduler.config.checkpoint_interval
        b = self.pools.buffers
        s.kv_cache_bytes = sum(t.numel() * t.element_size() for t in (*b.k, *b.v))
        s.conv_state_bytes = sum(t.numel() * t.element_size() for t in b.conv)
        s.ssm_state_bytes = sum(t.numel() * t.element_size() for t in b.ssm)
        s.weight_bytes = self.weight_bytes
        if self.spec is not None:
            c = self.spec.counters
            s.avg_spec_accept_length = c.avg_accept_length
            s.spec_accept_length = c.recent_accept_length
            s.spec_accept_rate = c.accept_rate
            s.spec_verify_calls_total = c.verify_calls
        if self.elastic is not None:
            self.elastic.fill_stats(s)
        return s

    def resolved_args(self) -> dict[str, Any]:
        out = asdict(self.args)
        plan = self.pools.plan
        out.update(
            dtype=str(self.dtype).removeprefix("torch."),
            mamba_radix_cache_strategy=self.pools.strategy,
            max_running_requests=plan.max_running_requests,
            max_mamba_cache_size=plan.max_mamba_cache_size,
            max_total_tokens=plan.max_total_num_tokens,
            context_length=self.context_len,
            chunked_prefill_size=self.scheduler.config.chunked_prefill_size,
            max_prefill_tokens=self.max_prefill_tokens,
        )
        if self.spec is not None:  # as SGLang's server_args after its speculative auto-choices
            c = self.spec.config
            out.update(
                speculative_algorithm=c.algorithm,
                speculative_num_steps=c.num_steps,
                speculative_num_draft_tokens=c.num_draft_tokens,
                speculative_eagle_topk=1,
            )
        return out

    def log_state_stats(self) -> None:
        s = self.scheduler.stats()
        logger.info(
            "Mamba state stats: slots in-use=%d cached=%d free=%d total=%d, mamba_usage=%.2f, "
            "cache_hit_rate=%.3f, state_checkpoints=%d, state_evictions=%d, kv_evicted_pages=%d",
            s.state_slots_in_use,
            s.state_slots_cached,
            s.state_slots_free,
            s.state_slots_total,
            s.mamba_usage,
            s.cache_hit_rate,
            s.state_checkpoints,
            s.state_evictions,
            s.kv_evictions,
        )


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


def _cache_manager(args: EngineArgs, pools: Pools) -> CacheManager:
    return CacheManager(
        KVPagePool(pools.plan.max_total_num_tokens // args.page_size, args.page_size),
        StateSlotPool(pools.num_state_slots, pools.buffers),
        radix_enabled=not args.disable_radix_cache,
        dual_lru=args.dual_lru_eviction,
        snapshot_on_match=args.state_snapshot_on_match,
        copy_on_write=args.state_copy_on_write,
    )


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

    return make_elastic(pools, layout, args.page_size, args.device, args.elastic_realloc_timeout_s)


def _spec_config(args: EngineArgs) -> SpecConfig | None:
    """The resolved speculative options (None: off); bad ones refuse to start, naming the key to change."""
    if args.speculative_algorithm in (None, "", "none", "NONE"):
        return None
    from runtime.spec.setup import spec_config_from_args

    try:
        return spec_config_from_args(args)
    except SpecConfigError as exc:
        raise EngineStartupError(str(exc)) from None


def _available_mem_gb() -> float:
    try:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / (1 << 30)
    except (ValueError, OSError, AttributeError):
        return 0.0
