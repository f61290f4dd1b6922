"""Intra-op threads of the compiled decode and of the engine's eager forwards (decode batches and extends of at
most SERIAL_FORWARD_MAX_TOKENS tokens; prefills, in a chooser of their own: runtime/engine/model_runner.py), chosen
per step from measured wall time (no torch here).

Why adaptive: on a quiet 2-core host two threads cut a batch-8 compiled decode step from ~10 to ~7 ms, but when
other processes hold the cores every fused kernel waits on a descheduled OpenMP peer and the same step takes
70-88 ms. Neither fixed choice is right on a host whose load changes, so each batch-size bucket estimates the step
time per sequence under each setting (the median of its last WINDOW steps), runs the faster one, and now and then
tries the other:

- exploit: run the bucket's current setting;
- explore: every `explore_every` steps, or at once when the current setting's estimate rises above the other's by
  MARGIN (a host that turns busy does that within three steps), run the other setting for EXPLORE_STEPS steps
  with a fresh estimate (the old one is from before the change), then switch if it is faster by MARGIN. A probe
  step over twice the current estimate ends the probe (a busy host is not probed for long); one under half of it
  switches at once. A probe that does not switch doubles the interval (up to MAX_EXPLORE_EVERY), so a busy
  host pays one slow step rarely.

Why a median and not a mean: behind an HTTP server the event loop and the clients share the cores, and now and
then one of them preempts an OpenMP worker mid-step: a single 2-thread step of 4-7 ms among 1.3 ms ones. An EWMA
(weight 0.5) switched on each such spike and ran on one thread until the next probe: 8 x 128 over HTTP 1371 vs
1558 tok/s with two threads pinned (peer model, quiet 2-core host). A median of five ignores isolated spikes and
still follows a load change within three steps.

Prefills (rare, long steps) also read what the rest of the host ran (`host_hints`; runtime/engine/host_load.py),
since one thread's time barely moves with the load and cannot tell that a second core came free. A probe starts
at once, not at the next periodic one, when:

- a step on fewer threads left every thread of the other count a core, or the host did so since the chooser's
  last step (then before the step);
- a step on more threads lost half a core of its own to other processes; that step's time alone is then the
  current setting's estimate (the older ones are from another load).

A probe on more threads that loses that half core ends after its step. The probe's measured times still decide;
a hinted probe that does not switch doubles the steps before the next hinted one (a CPU quota that /proc/stat
does not show cannot make every prefill probe).

A parallel reduction may sum in another order under another count; greedy tokens equal the eager engine's under
either (tests/runtime/test_torch_compile.py pins each).
"""

from __future__ import annotations

import collections
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from runtime.engine.host_load import CpuClocks, headroom, read_clocks
from runtime.native.threads import pinned_from_env

logger = logging.getLogger("runtime.engine")
T = TypeVar("T")

WINDOW = 5  # steps per setting whose median is its estimate: a load change shows after WINDOW // 2 + 1 steps
MARGIN = 0.1  # switch only when the other setting is >= 10% faster: no flapping on noise
EXPLORE_EVERY = 16
EXPLORE_STEPS = 3
MAX_EXPLORE_EVERY = 1024
# Host hints: a step on fewer threads whose host left (other count - SPARE_SLACK) cores free starts a probe of the
# other count; one on more threads left fewer than (its count - BUSY_SLACK) starts a probe of the fewer (or ends a
# probe of the more). The slack absorbs /proc/stat's 10 ms ticks over a step of >= 50 ms.
SPARE_SLACK = 0.25
BUSY_SLACK = 0.5
MAX_HINT_GAP = 64


def bucket_of(batch_size: int, width_bits: int = 1) -> int:
    """Bucket of powers of 2**width_bits (default 1, 2, 4, 8, ...; width 3: 1, 8, 64, 512, ...): step time per
    sequence (or per token) is comparable within one."""
    return 1 << ((max(batch_size, 1).bit_length() - 1) // width_bits * width_bits)


@dataclass
class _Bucket:
    current: int
    recent: dict[int, collections.deque[float]] = field(default_factory=dict)  # s per sequence per step, by count
    since_explore: int = 0
    explore_every: int = EXPLORE_EVERY
    exploring: int = 0  # steps left on the other setting
    hint_gap: int = 1  # steps on the current setting before a host hint may start a probe
    hinted: bool = False  # the running probe was started by a host hint


class DecodeThreadChooser:
    """`options`: the thread counts to choose between (1 and the process's torch thread count); `pinned`: use
    that count always (tests, or an operator who knows the host)."""

    def __init__(
        self,
        options: tuple[int, ...],
        pinned: int | None = None,
        label: str = "Decode",
        bucket_bits: int = 1,
        host_hints: bool = False,
        most_first: bool = False,
    ) -> None:
        self.options = tuple(sorted(set(options)))
        # A bucket's first step runs on the most threads instead of one: a prefill is compute-bound, so on an idle
        # host every core wins (the demo model's cold 2048-token prompt: ~215 vs ~390 ms), and the first request
        # of a size is the one a user times.
        self.most_first = most_first
        self.pinned = pinned
        self.label = label  # names the chooser in the log line of a switch
        # Wider buckets learn from fewer steps: a prefill is rare, and each bucket's first probe of the other
        # setting can cost a slow prefill on a busy host.
        self.bucket_bits = bucket_bits
        self.host_hints = host_hints
        self._buckets: dict[int, _Bucket] = {}
        self.switches = 0
        self.last_used: int | None = None  # the thread count of the last recorded step
        self._clocks: CpuClocks | None = None  # read at the end of the last step (host_hints)

    @classmethod
    def up_to(
        cls,
        threads: int,
        env: str,
        pinned: int | None = None,
        label: str = "Decode",
        bucket_bits: int = 1,
        host_hints: bool = False,
        most_first: bool = False,
    ) -> DecodeThreadChooser:
        """Between 1 and `threads` (the process's torch thread count), unless `pinned` or the environment
        variable `env` pins a count."""
        pinned = pinned if pinned is not None else pinned_from_env(env)
        options = (pinned,) if pinned is not None else (1, threads)
        return cls(options, pinned, label, bucket_bits, host_hints, most_first)

    def timed(self, batch_size: int, run: Callable[[int], T]) -> T:
        """`run(threads)` on the chosen count, its wall time recorded; a bucket that switches is logged."""
        hints = self.host_hints and self.adaptive
        before = read_clocks() if hints else None
        threads = self.choose(batch_size, headroom(self._clocks, before) if hints else None)
        switches = self.switches
        t0 = time.perf_counter()
        out = run(threads)
        seconds = time.perf_counter() - t0
        if hints:
            self._clocks = read_clocks()
        self.record(batch_size, threads, seconds, headroom(before, self._clocks) if hints else None)
        if self.switches != switches:
            logger.info("%s threads: batch %d now on %s", self.label, batch_size, self.describe_bucket(batch_size))
        return out

    @property
    def adaptive(self) -> bool:
        return self.pinned is None and len(self.options) > 1

    def describe(self) -> str:
        if self.pinned is not None:
            return f"{self.pinned} (pinned)"
        if not self.adaptive:
            return str(self.options[0])
        return "adaptive " + "|".join(map(str, self.options))

    def describe_bucket(self, batch_size: int) -> str:
        """The bucket's setting and its per-sequence step-time estimates, for the log line of a switch."""
        b = self._bucket(batch_size)
        est = ", ".join(f"{t}: {1e3 * _estimate(b, t):.3f} ms" for t in sorted(b.recent))
        return f"{b.current} thread(s) (bucket {bucket_of(batch_size, self.bucket_bits)}, per-sequence step {est})"

    def in_use(self) -> dict[int, int]:
        """The current setting of every bucket seen so far."""
        return {b: s.current for b, s in sorted(self._buckets.items())}

    def choose(self, batch_size: int, gap_room: float | None = None) -> int:
        """`gap_room`: the cores the rest of the host left this process since this chooser's last step, if
        read. Spare cores there start a probe of more threads now (one thread's times, which barely move with the
        load, are a fair yardstick for it; the other way, the current setting's estimate would be from before
        the change, so that hint waits for a step: `record`)."""
        if self.pinned is not None:
            return self.pinned
        if not self.adaptive:
            return self.options[0]
        b = self._bucket(batch_size)
        untried = [t for t in self.options if t not in b.recent]
        if untried and self._probes_on_hints:
            return self._other(b) if b.exploring else b.current
        if untried:
            return untried[-1] if self.most_first else untried[0]
        other = self._other(b)
        if not b.exploring and other > b.current and b.since_explore + 1 >= b.hint_gap:
            if self._host_favours_other(b.current, other, gap_room):
                b.since_explore = 0
                b.exploring = EXPLORE_STEPS
                b.hinted = True
        return other if b.exploring else b.current

    def record(self, batch_size: int, threads: int, seconds: float, room: float | None = None) -> None:
        """`room`: the cores the rest of the host left this process during the step (host_load.headroom), if
        read."""
        self.last_used = threads
        if not self.adaptive:
            return
        b = self._bucket(batch_size)
        per_seq = seconds / max(batch_size, 1)
        other = self._other(b)
        first = threads not in b.recent
        samples = b.recent.setdefault(threads, collections.deque(maxlen=WINDOW))
        if threads == other and b.exploring == EXPLORE_STEPS:
            samples.clear()  # a probe's first step starts the other setting's estimate afresh (another load)
        samples.append(per_seq)
        if len(b.recent) < len(self.options):
            if self._probes_on_hints and not b.exploring and _short_of_cores(threads, room):
                b.exploring, b.hinted = EXPLORE_STEPS, True  # the first probe of fewer threads: a busy host
                b.recent[threads] = collections.deque([per_seq], maxlen=WINDOW)  # the busy host's estimate
            return
        if first:  # the first measurement of the last untried setting: compare, no probe to end
            self._maybe_switch(b)
            return
        current = _estimate(b, b.current)
        if threads == other:
            b.exploring -= 1
            if per_seq > 2 * current or 2 * per_seq < current or _short_of_cores(threads, room):
                b.exploring = 0  # clearly worse (stop paying for the probe) or clearly better (take it now)
            if b.exploring <= 0:
                b.exploring = 0
                if not self._maybe_switch(b):
                    b.explore_every = min(2 * b.explore_every, MAX_EXPLORE_EVERY)
                    if b.hinted:
                        b.hint_gap = min(2 * b.hint_gap, MAX_HINT_GAP)
            return
        b.since_explore += 1
        # The current setting got slower than the other's estimate; that estimate is from before the change
        # (a busy host slows both), so probe the other now rather than switch on it.
        hinted = b.since_explore >= b.hint_gap and self._host_favours_other(threads, other, room)
        if hinted or b.since_explore >= b.explore_every or _estimate(b, other) < (1 - MARGIN) * current:
            b.since_explore = 0
            b.exploring = EXPLORE_STEPS
            b.hinted = hinted
            if hinted:  # the host changed: this step is the current setting's estimate, not the ones before it
                b.recent[threads] = collections.deque([per_seq], maxlen=WINDOW)

    @property
    def _probes_on_hints(self) -> bool:
        """Most threads first, and fewer only when the host hints it is short of cores: on an idle host the
        one-thread probe was a whole prefill at half speed (the real Nemotron-H's second 2048-token prompt: 5.8 s
        against 3.2 s), and it fell on whichever request came second, the one a user times."""
        return self.most_first and self.host_hints

    @staticmethod
    def _host_favours_other(threads: int, other: int, room: float | None) -> bool:
        """Whether the host, during a step on `threads`, favoured the `other` count: more threads, each of which
        would have had a core, or fewer, as this step lost part of a core to other processes."""
        if room is None:
            return False
        if other > threads:
            return room >= other - SPARE_SLACK
        return _short_of_cores(threads, room)

    def _maybe_switch(self, b: _Bucket) -> bool:
        other = self._other(b)
        if _estimate(b, other) < (1 - MARGIN) * _estimate(b, b.current):
            b.current = other
            b.since_explore = 0
            b.explore_every = EXPLORE_EVERY
            b.hint_gap = 1
            self.switches += 1
            return True
        return False

    def _bucket(self, batch_size: int) -> _Bucket:
        key = bucket_of(batch_size, self.bucket_bits)
        if key not in self._buckets:
            self._buckets[key] = _Bucket(current=self.options[-1] if self._probes_on_hints else self.options[0])
        return self._buckets[key]

    def _other(self, b: _Bucket) -> int:
        return self.options[-1] if b.current == self.options[0] else self.options[0]


def _short_of_cores(threads: int, room: float | None) -> bool:
    """A step on several threads that other processes took half a core from."""
    return room is not None and threads > 1 and room < threads - BUSY_SLACK


def _estimate(b: _Bucket, threads: int) -> float:
    return statistics.median(b.recent[threads])
