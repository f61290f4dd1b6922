"""Intra-op threads of the compiled decode, chosen per step from measured wall time (no torch here).

Why adaptive: on a quiet 2-core host two threads cut a batch-8 compiled decode step from ~10 to ~7 ms, but when
other processes hold the cores every fused kernel waits on a descheduled OpenMP peer and the same step takes
70-88 ms. Neither fixed choice is right on a host whose load changes, so each batch-size bucket keeps an EWMA of
the step time per sequence under each setting, runs the faster one, and now and then tries the other:

- exploit: run the bucket's current setting;
- explore: every `explore_every` steps, or at once when the current setting's EWMA rises above the other's by
  MARGIN (a host that turns busy does that within a step or two), run the other setting for EXPLORE_STEPS steps
  with a fresh estimate (the old one is from before the change), then switch if it is faster by MARGIN. A probe
  step over twice the current EWMA ends the probe (a busy host is not probed for long); one under half of it
  switches at once. A probe that does not switch doubles the interval (up to MAX_EXPLORE_EVERY), so a busy
  host pays one slow step rarely.

A parallel reduction may sum in another order under another count; greedy tokens equal the eager engine's under
either (tests/runtime/test_torch_compile.py pins each).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALPHA = 0.5  # EWMA weight of a new sample: the current setting's estimate follows a load change in 1-2 steps
MARGIN = 0.1  # switch only when the other setting is >= 10% faster: no flapping on noise
EXPLORE_EVERY = 64
EXPLORE_STEPS = 3
MAX_EXPLORE_EVERY = 1024


def bucket_of(batch_size: int) -> int:
    """Power-of-two bucket (1, 2, 4, 8, ...): step time per sequence is comparable within one."""
    return 1 << (max(batch_size, 1).bit_length() - 1)


@dataclass
class _Bucket:
    current: int
    ewma: dict[int, float] = field(default_factory=dict)  # seconds per sequence per step, by thread count
    since_explore: int = 0
    explore_every: int = EXPLORE_EVERY
    exploring: int = 0  # steps left on the other setting


class DecodeThreadChooser:
    """`options`: the thread counts to choose between (1 and the process's torch thread count); `pinned`: use
    that count always (tests, or an operator who knows the host)."""

    def __init__(self, options: tuple[int, ...], pinned: int | None = None) -> None:
        self.options = tuple(sorted(set(options)))
        self.pinned = pinned
        self._buckets: dict[int, _Bucket] = {}
        self.switches = 0
        self.last_used: int | None = None  # the thread count of the last recorded step

    @property
    def adaptive(self) -> bool:
        return self.pinned is None and len(self.options) > 1

    def describe(self) -> str:
        if self.pinned is not None:
            return f"{self.pinned} (pinned)"
        if not self.adaptive:
            return str(self.options[0])
        return "adaptive " + "|".join(map(str, self.options))

    def in_use(self) -> dict[int, int]:
        """The current setting of every bucket seen so far."""
        return {b: s.current for b, s in sorted(self._buckets.items())}

    def choose(self, batch_size: int) -> int:
        if self.pinned is not None:
            return self.pinned
        if not self.adaptive:
            return self.options[0]
        b = self._bucket(batch_size)
        untried = [t for t in self.options if t not in b.ewma]
        if untried:
            return untried[0]
        return self._other(b) if b.exploring else b.current

    def record(self, batch_size: int, threads: int, seconds: float) -> None:
        self.last_used = threads
        if not self.adaptive:
            return
        b = self._bucket(batch_size)
        per_seq = seconds / max(batch_size, 1)
        other = self._other(b)
        old = b.ewma.get(threads)
        # A probe's first step starts the other setting's estimate afresh: the old one is from another load.
        fresh = old is None or (threads == other and b.exploring == EXPLORE_STEPS)
        b.ewma[threads] = per_seq if fresh else ALPHA * per_seq + (1 - ALPHA) * (old or 0.0)
        if len(b.ewma) < len(self.options):
            return
        if old is None:  # the first measurement of the last untried setting: compare, no probe to end
            self._maybe_switch(b)
            return
        if threads == other:
            b.exploring -= 1
            if per_seq > 2 * b.ewma[b.current] or 2 * per_seq < b.ewma[b.current]:
                b.exploring = 0  # clearly worse (stop paying for the probe) or clearly better (take it now)
            if b.exploring <= 0:
                b.exploring = 0
                if not self._maybe_switch(b):
                    b.explore_every = min(2 * b.explore_every, MAX_EXPLORE_EVERY)
            return
        b.since_explore += 1
        # The current setting got slower than the other's estimate; that estimate is from before the change
        # (a busy host slows both), so probe the other now rather than switch on it.
        if b.since_explore >= b.explore_every or b.ewma[other] < (1 - MARGIN) * b.ewma[b.current]:
            b.since_explore = 0
            b.exploring = EXPLORE_STEPS

    def _maybe_switch(self, b: _Bucket) -> bool:
        other = self._other(b)
        if b.ewma[other] < (1 - MARGIN) * b.ewma[b.current]:
            b.current = other
            b.since_explore = 0
            b.explore_every = EXPLORE_EVERY
            self.switches += 1
            return True
        return False

    def _bucket(self, batch_size: int) -> _Bucket:
        key = bucket_of(batch_size)
        if key not in self._buckets:
            self._buckets[key] = _Bucket(current=self.options[0])
        return self._buckets[key]

    def _other(self, b: _Bucket) -> int:
        return self.options[-1] if b.current == self.options[0] else self.options[0]
