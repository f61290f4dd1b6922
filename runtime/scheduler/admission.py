"""Which prompt chunks a step computes: the step's prompt-token budget while requests decode, the unfinished
prefills, then admissions from the waiting queue (a KV reservation and a state slot each, `CacheManager.admit`),
within `max_prefill_tokens` and the running cap. A waiting request that shares a prefix with one in prefill waits
for its leader (prefix_sharing.py). The scheduler owns the queues; this reads and moves requests between them.
"""

from __future__ import annotations

import logging
from typing import Protocol

from runtime.core.requests import EngineStats
from runtime.kvcache.cache_manager import CacheManager
from runtime.scheduler import logprobs as lp
from runtime.scheduler.checkpoints import CheckpointPlanner
from runtime.scheduler.config import SchedulerConfig
from runtime.scheduler.policy import order_waiting
from runtime.scheduler.prefix_sharing import find_leader
from runtime.scheduler.request import Req
from runtime.scheduler.step_budget import PauseBudget, fits
from runtime.scheduler.stopping import abort_reason

logger = logging.getLogger("runtime.scheduler")


class DraftTokens(Protocol):
    """What admission asks of a speculative decoder: the room its verify forwards need."""

    @property
    def extra_tokens(self) -> int: ...


class AdmissionHost(Protocol):
    """The scheduler's state and operations admission uses (runtime/scheduler/scheduler.py Scheduler)."""

    config: SchedulerConfig
    cache: CacheManager
    checkpoints: CheckpointPlanner
    pause_budget: PauseBudget
    counters: EngineStats
    waiting: list[Req]
    running: list[Req]

    @property
    def spec(self) -> DraftTokens | None: ...

    @property
    def mixing(self) -> bool: ...

    def fail(self, req: Req, stage: str, exc: BaseException, status_code: int = 500) -> None: ...

    def finish(self, req: Req, reason: dict) -> None: ...


class PrefillAdmission:
    def __init__(self, host: AdmissionHost) -> None:
        self.host = host

    def budget(self, decoding: int) -> int:
        """Prompt tokens this step may compute while `decoding` requests decode (SGLang's PrefillAdder: a mixed
        step's decode rows come out of the chunk's tokens)."""
        cfg = self.host.config
        budget = cfg.chunked_prefill_size if cfg.chunked_prefill_size > 0 else 1 << 62
        if decoding and cfg.decode_pause_target_s > 0:  # the measured cost covers the decode rows
            # Unfinished prefills take the budget first; a step later in its prompt costs more a token.
            position = next((r.mem.kv_len for r in self.host.running if r.in_prefill and r.mem is not None), 0)
            return max(min(budget, self.host.pause_budget.prompt_tokens(decoding, position)), 1)
        if decoding and cfg.decoding_step_tokens > 0:
            budget = min(budget, cfg.decoding_step_tokens)
        if decoding and self.host.mixing:
            budget -= decoding
        return max(budget, 1)  # a prompt still advances when the decode rows alone fill the cap

    def chunks(self, budget: int) -> list[tuple[Req, int]]:
        """(request, tokens to compute) for this step's prompt chunks, at most `budget` tokens: unfinished
        prefills first, then admissions."""
        batch: list[tuple[Req, int]] = []
        limit, used = self.host.config.max_prefill_tokens, 0
        for req in self.host.running:
            if req.in_prefill and budget > 0:
                n = self.host.checkpoints.chunk_len(req, budget)
                if not fits(used, n, limit):
                    continue
                batch.append((req, n))
                budget -= n
                used += n
        if budget <= 0 or not self.host.waiting:
            return batch
        self.host.waiting = order_waiting(self.host.waiting, self.host.config.schedule_policy, self._cached_prefix_len)
        for req in list(self.host.waiting):
            if budget <= 0 or len(self.host.running) >= self.host.config.max_running_requests or 0 < limit <= used:
                break
            if self._prefix_leader(req) is not None:
                continue  # admitted once the leader has cached the prefix they share
            if limit > 0 and used and not fits(used, self._uncached_len(req, budget, limit - used), limit):
                continue  # a later, shorter one may still fit; this one leads a step of its own soon
            # The last token's KV is never computed (but a prompt-only scoring request computes the whole prompt).
            total = len(req.prompt_ids) + max(req.max_new_tokens, 1) - 1
            if self.host.spec is not None:
                total += self.host.spec.extra_tokens  # a verify forward runs past the final length
            try:
                admission, mem = self.host.cache.admit(req.prompt_ids, total, max_prefix=lp.prefix_limit(req))
            except Exception as exc:  # noqa: BLE001 - this request fails alone; the others are scheduled
                self.host.fail(req, "admission", exc)
                continue
            if not admission.ok:
                if admission.message:  # can never fit: this request fails alone, the others go on
                    self.host.waiting.remove(req)
                    self.host.counters.num_allocation_failures += 1
                    logger.error("request %s: %s", req.rid, admission.message)
                    self.host.finish(req, abort_reason(admission.message, 503, "ServiceUnavailable"))
                    continue
                break  # waits for memory; keep arrival order instead of letting later requests jump ahead
            self.host.waiting.remove(req)
            req.mem = mem
            req.cached_tokens = admission.cached_tokens
            self.host.counters.prompt_tokens_total += len(req.prompt_ids)
            self.host.counters.cached_tokens_total += req.cached_tokens
            self.host.running.append(req)
            n = self.host.checkpoints.chunk_len(req, budget)
            batch.append((req, n))
            budget -= n
            used += n
        return batch

    def _uncached_len(self, req: Req, budget: int, room: int) -> int:
        """The prompt tokens admitting `req` now would add to the step (its prompt past what the tree holds, at
        most `budget`); a prompt that fits in `room` whole needs no look-up in the tree."""
        n = len(req.prompt_ids)
        if n > room:
            n -= self._cached_prefix_len(req)
        return min(n, budget)

    def _cached_prefix_len(self, req: Req) -> int:
        if not self.host.cache.caching:
            return 0
        return self.host.cache.tree.match_prefix(req.prompt_ids[:-1]).length

    def _prefix_leader(self, req: Req) -> Req | None:
        """The request in prefill about to cache a prefix `req` shares, which `req` should wait for."""
        if not self.host.cache.caching:
            return None
        return find_leader(
            req,
            [r for r in self.host.running if r.in_prefill],
            min_tokens=self.host.config.in_batch_prefix_min_tokens,
            page_size=self.host.cache.page_size,
            cached_len=self._cached_prefix_len,
            checkpoints_ahead=self.host.checkpoints.ahead,
        )
