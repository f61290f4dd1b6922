"""Which prompt positions' states go into the prefix cache during prefill, and where a prefill chunk must end.

A checkpoint is the state after a prompt position, cached with the KV before it: every `interval` tokens
(extra_buffer), the branch point (where the tree's KV for the prompt ends without a state) and the share points
waiting requests asked for (prefix_sharing.py). A model that writes states mid-forward gets spare
slots for them in the prefill forward itself; otherwise a chunk ends at each checkpoint and the request's slot is
copied after it.
"""

from __future__ import annotations

from typing import Protocol

from runtime.kvcache.cache_manager import CacheManager
from runtime.scheduler.request import Req


class CheckpointSettings(Protocol):
    """The scheduler's settings the planner reads (SchedulerConfig), live: a test may switch them."""

    checkpoint_interval: int  # 0: no interval checkpoints (cache off, or no_buffer strategy)
    in_forward_checkpoints: bool


class CheckpointPlanner:
    def __init__(self, cache: CacheManager, settings: CheckpointSettings) -> None:
        self.cache = cache
        self.settings = settings

    def points(self, req: Req, start: int, end: int) -> list[int]:
        """Prompt positions in (start, end] whose state goes into the cache: every `interval` tokens, the branch
        point (where the tree's KV for this prompt ends without a state), and where the prompts of waiting
        requests leave this one (share_points)."""
        mem = req.mem
        if mem is None or not self.cache.caching:
            return []
        interval = self.settings.checkpoint_interval
        points = list(range((start // interval + 1) * interval, end + 1, interval)) if interval > 0 else []
        marks = [p for p in (mem.branch_len, *req.share_points) if start < p <= end]
        if marks:
            points = sorted({*points, *marks})
        ps = self.cache.page_size
        # The prompt's last position is left to the end-of-request insert (prompt + output[:-1]).
        return [p for p in points if mem.tree_len < p < len(req.prompt_ids) and p % ps == 0]

    def ahead(self, req: Req, end: int) -> list[int]:
        """The checkpoints between what the request has computed and prompt position `end`."""
        assert req.mem is not None
        return self.points(req, req.mem.kv_len, end)

    def chunk_len(self, req: Req, budget: int) -> int:
        """Prompt tokens the request computes in this prefill step, within `budget`."""
        assert req.mem is not None
        start = req.mem.kv_len
        end = min(len(req.prompt_ids), start + budget)
        if not self.settings.in_forward_checkpoints:
            # Stop at the next checkpoint so the state there exists (in the request's slot) to be copied.
            end = next(iter(self.points(req, start, end)), end)
        return end - start

    def take_slots(self, req: Req, n: int) -> list[tuple[int, int]]:
        """(new tokens consumed, spare slot) for each state the model writes into the cache during a forward
        that computes the request's next `n` prompt tokens (none unless the model writes states mid-forward)."""
        assert req.mem is not None
        if not self.settings.in_forward_checkpoints:
            return []
        start = req.mem.kv_len
        cps: list[tuple[int, int]] = []
        for p in self.points(req, start, start + n):
            slot = self.cache.take_checkpoint_slot()
            if slot is None:  # every slot is running a request: skip the checkpoint, not the work
                break
            cps.append((p - start, slot))
        return cps
