"""Which prompt positions' states go into the prefix cache during prefill, and where a prefill chunk must end.

A checkpoint is the state after a prompt position, cached with the KV before it: every `interval` tokens
(extra_buffer), the branch point (where the tree's KV for the prompt ends without a state) and the share points
waiting requests asked for (prefix_sharing.py). A model that writes states mid-forward gets spare
slots for them in the prefill forward itself; otherwise a chunk ends at each checkpoint and the request's slot is
copied after it.

The tail of a long prompt (`_has_tail`) gets more (extra_buffer, in-forward only): the last
page before its final token, so an exact repeat (which must compute that token for its logits) recomputes one
page, not up to `interval` tokens; and a grid `TAIL_STEPS` times finer over its last `interval` tokens, because a
later prompt that shares most of this one (the same document with another question, an edited last turn, a
retry) branches off near its end, and every token between the branch and the state it resumes from is recomputed
on its TTFT (peers harness, 2000 of 2048 tokens shared, interval 64: 64 tokens recomputed instead of 48). They
cost state slots (LRU-evicted like any checkpoint), not forwards: the model writes them during the forward it runs
anyway, where a split forward would pay a forward each, so the split path keeps the interval grid alone.
"""

from __future__ import annotations

from typing import Protocol

from runtime.kvcache.cache_manager import CacheManager
from runtime.scheduler.request import Req

# The last `interval` prompt tokens get a checkpoint every interval // TAIL_STEPS tokens (at least a page), in a
# prompt that computes more than TAIL_MIN_INTERVALS intervals.
TAIL_STEPS = 4
TAIL_MIN_INTERVALS = 2


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
        points = _grid(interval, start, end)
        ps = self.cache.page_size
        n = len(req.prompt_ids)
        marks = [mem.branch_len, *req.share_points]
        if self._has_tail(req, interval) and end > n - 1 - interval:
            step = max(ps, interval // TAIL_STEPS // ps * ps)
            marks += [p for p in _grid(step, max(start, n - 1 - interval), end) if p < n]
            marks.append((n - 1) // ps * ps)  # an exact repeat resumes here
        marks = [p for p in marks if start < p <= end]
        if marks:
            points = sorted({*points, *marks})
        # The prompt's last position is left to the end-of-request insert (prompt + output[:-1]).
        return [p for p in points if mem.tree_len < p < n and p % ps == 0]

    def _has_tail(self, req: Req, interval: int) -> bool:
        """Whether the prompt gets tail checkpoints: in-forward ones only, and only a long prompt, one that computes
        more than TAIL_MIN_INTERVALS intervals. A short one (a warm hit resuming near its end, a short question)
        keeps the interval grid and its branch point, so it still fits a compiled extend, whose graph takes one
        checkpoint at most (runtime/engine/compiled_extend.py; its default 128 tokens are two default intervals)."""
        computed = len(req.prompt_ids) - req.cached_tokens
        return interval > 0 and self.settings.in_forward_checkpoints and computed > TAIL_MIN_INTERVALS * interval

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
        # Latest first: when the slots run out (every one running a request or taken by this forward), the
        # checkpoints skipped are the earliest, and a later prompt sharing most of this one still resumes near
        # its end (the tail grid) instead of an interval or more before it. Skipped: the checkpoint, not the work.
        for p in reversed(self.points(req, start, start + n)):
            slot = self.cache.take_checkpoint_slot()
            if slot is None:
                break
            cps.append((p - start, slot))
        return cps[::-1]


def _grid(step: int, start: int, end: int) -> list[int]:
    """Multiples of `step` in (start, end]; none for step 0."""
    return list(range((start // step + 1) * step, end + 1, step)) if step > 0 else []
