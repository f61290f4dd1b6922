"""The engine in one object, single-threaded: model + tokenizer + pools + prefix cache + scheduler + runner.

`EngineCore.step()` is schedule → run → postprocess. The threaded client (engine_thread.py) drives it for the
server; tests drive it directly, in-process. `builder.py` builds it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, fields
from typing import Any

import torch

from hybridshared.flags.flag_types import AUTO
from runtime.core.config import EngineArgs
from runtime.core.requests import EngineStats, GenerateRequest, RequestOutput
from runtime.engine.builder import EngineParts, build_engine
from runtime.kvcache.cache_manager import Admission
from runtime.scheduler.request import Req
from runtime.scheduler.transferred import Transferred, admit_transferred

logger = logging.getLogger("runtime.engine")

# Free state slots made ready while the engine is idle (StateSlotPool.prefault) before any traffic: as many as fit
# in this many bytes, at least one (a large model's slot is tens of MB: idle memory right after start-up grows by
# at most this much, or one slot).
IDLE_PREFAULT_BYTES = 16 << 20
# Once traffic has run, the idle reserve is the most slots any of this many recent busy spells took (a cold
# 2048-token prompt: its slot plus ~32 checkpoints, each slot's first write otherwise faulting its pages in on the
# prompt's critical path: 240k faults, over 1 s of a real-size Nemotron-H cold TTFT on this VM).
IDLE_RESERVE_SPELLS = 4


class EngineCore(EngineParts):
    """The parts build_engine makes (EngineParts: declared there, once) and the operations that run them."""

    def __init__(self, args: EngineArgs) -> None:
        """Build the engine in start-up order (runtime/engine/builder.py); refuses with EngineStartupError."""
        parts = build_engine(args)
        super().__init__(**{f.name: getattr(parts, f.name) for f in fields(EngineParts)})
        # (state slots, KV pages) handed out per recent busy spell; start-up's warm-ups are no traffic
        self._spells: deque[tuple[int, int]] = deque(maxlen=IDLE_RESERVE_SPELLS)
        self._handed_out_at_idle = self._handed_out()

    @property
    def context_len(self) -> int:
        return self.pools.context_len

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

    def on_idle(self, interrupted: Callable[[], bool], *, next_only: bool = False) -> bool:
        """Work for when no request runs (the engine thread calls it before it blocks), dropped as soon as
        `interrupted()` (a command arrived): fault in the state slots (then KV pages) the next requests will be
        handed, so their first write does not (the elastic pool's chunks move: not there). `next_only`: just the
        slot the next request takes (one slot's pages, ~0.4 MB for the peer model: a fraction of a millisecond,
        done the moment the engine goes idle, before a client's next request can arrive). Returns whether the
        work is done (False: interrupted, what is left waits for the next idle moment; a call with nothing left
        costs a few list lookups)."""
        handed_out = self._handed_out()
        if handed_out != self._handed_out_at_idle:  # a busy spell ended: what it took is the next one's guess
            self._spells.append(
                (handed_out[0] - self._handed_out_at_idle[0], handed_out[1] - self._handed_out_at_idle[1])
            )
            self._handed_out_at_idle = handed_out
        if self.elastic is not None:
            return True
        count = 1 if next_only else self.idle_prefault_slots()
        self.cache.state_pool.prefault(count, interrupted)
        if self.cache.state_pool.next_unwritten(count):
            return False  # interrupted
        if not next_only and self._spells:  # the KV pages a cold prompt writes, once its states are ready
            kv = self.pools.buffers
            self.cache.kv_pool.prefault(max(n for _, n in self._spells), [*kv.k, *kv.v], interrupted)
            return not interrupted()
        return True

    def forget_busy_spell(self) -> None:
        """What was handed out since the engine was last idle is no traffic (the server's start-up warm-up):
        the next on_idle does not take it as a busy spell's need."""
        self._handed_out_at_idle = self._handed_out()

    def _handed_out(self) -> tuple[int, int]:
        return self.cache.state_pool.handed_out, self.cache.kv_pool.handed_out

    def idle_prefault_slots(self) -> int:
        """How many free state slots on_idle keeps faulted in: a fixed few bytes' worth until traffic has shown
        what a busy spell takes, then the most a recent spell took (the pool's free list bounds it)."""
        floor = max(1, IDLE_PREFAULT_BYTES // max(1, self.cache.state_pool.slot_bytes))
        return max(floor, *(n for n, _ in self._spells)) if self._spells else floor

    # -- PD disaggregation (runtime/pd): the engine's two operations for a transfer, on the engine thread -------

    def before_release(self, hook: Callable[[Req], None]) -> None:
        """Call `hook(req)` just before a request's memory goes back to the pools: the prefill side copies the
        prompt's KV and state out there. One hook; a second call replaces it."""
        self.scheduler.on_release = hook

    def admit_transferred(
        self,
        g: GenerateRequest,
        on_output: Callable[[RequestOutput], None],
        transferred: Transferred,
        write: Callable[[int, torch.Tensor], None],
    ) -> Admission:
        """Admit a request whose prompt another engine computed (runtime/scheduler/transferred.py)."""
        return admit_transferred(self.scheduler, g, on_output, transferred, write)

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
        s.max_prefill_tokens = self.scheduler.config.max_prefill_tokens
        s.radix_cache_enabled = not self.args.disable_radix_cache
        s.mamba_radix_cache_strategy = self.pools.strategy
        s.mamba_track_interval = self.scheduler.config.checkpoint_interval
        s.kv_cache_bytes, s.conv_state_bytes, s.ssm_state_bytes = self.pools.used_bytes()
        s.weight_bytes = self.weight_bytes
        s.torch_compile = self.runner.compiled_paths() if self.args.enable_torch_compile else "off"
        s.native_decode = self.runner.native_status
        native = self.runner.native_decode
        s.native_decode_threads = native.describe_threads() if native is not None else ""
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
        plan, cfg = self.pools.plan, self.scheduler.config
        out.update(
            dtype=str(self.dtype).removeprefix("torch."),
            mamba_radix_cache_strategy=self.pools.strategy,
            max_running_requests=plan.max_running_requests,
            max_mamba_cache_size=plan.max_mamba_cache_size,
            max_total_tokens=plan.max_total_num_tokens,
            context_length=self.context_len,
            chunked_prefill_size=self.scheduler.config.chunked_prefill_size,
            max_prefill_tokens=self.scheduler.config.max_prefill_tokens,
            enable_mixed_chunk=self.scheduler.mixing,
            decoding_step_tokens=AUTO if cfg.decode_pause_target_s > 0 else cfg.decoding_step_tokens,
            decode_pause_target_ms=cfg.decode_pause_target_s * 1000 or self.args.decode_pause_target_ms,
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
