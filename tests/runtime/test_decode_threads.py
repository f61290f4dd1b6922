"""The compiled decode's thread chooser (runtime/engine/decode_threads.py) on simulated hosts: per-step wall
times come from a cost table that the test changes mid-run (quiet host, then busy, then quiet again)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.engine.decode_threads import MAX_EXPLORE_EVERY, WINDOW, DecodeThreadChooser, bucket_of


def _run(chooser: DecodeThreadChooser, cost_ms: dict[int, float], steps: int, batch: int = 8) -> list[int]:
    """`steps` decode steps of `batch` sequences; returns the thread count each step ran with."""
    used = []
    for _ in range(steps):
        n = chooser.choose(batch)
        chooser.record(batch, n, cost_ms[n] / 1000)
        used.append(n)
    return used


def test_quiet_host_settles_on_two_threads_where_they_pay() -> None:
    chooser = DecodeThreadChooser((1, 2))
    used = _run(chooser, {1: 10.0, 2: 7.0}, 500)
    assert chooser.in_use() == {8: 2}
    assert used[2:].count(1) <= 0.03 * 500  # only the periodic probes of the other setting


def test_busy_host_falls_back_within_four_steps_and_probes_rarely() -> None:
    chooser = DecodeThreadChooser((1, 2))
    _run(chooser, {1: 10.0, 2: 7.0}, 200)
    assert chooser.in_use() == {8: 2}
    busy = {1: 14.0, 2: 80.0}  # a descheduled OpenMP peer stalls every kernel
    # Three slow steps on 2 threads move the median of five, then one probe step on 1: clearly better, taken.
    first = _run(chooser, busy, WINDOW // 2 + 2)
    assert first == [2] * (WINDOW // 2 + 1) + [1] and chooser.in_use() == {8: 1}
    later = _run(chooser, busy, 3000)
    # Each probe stops after one slow step and doubles the interval: a handful of 80 ms steps in 3000.
    assert later.count(2) <= 8, later.count(2)


def test_isolated_spikes_do_not_switch() -> None:
    """Behind an HTTP server the event loop now and then preempts an OpenMP worker: one 2-thread step in 20 takes
    5x its time. Two threads stay in use; only the periodic probes run on one."""
    chooser = DecodeThreadChooser((1, 2))
    used = []
    for step in range(1000):
        n = chooser.choose(1)
        cost = {1: 1.5, 2: 1.2}[n] * (5.0 if n == 2 and step % 20 == 0 else 1.0)
        chooser.record(1, n, cost / 1000)
        used.append(n)
    assert chooser.in_use() == {1: 2} and chooser.switches == 1
    assert used[2:].count(1) <= 0.03 * 1000


def test_back_to_two_threads_when_the_host_quiets_down() -> None:
    chooser = DecodeThreadChooser((1, 2))
    _run(chooser, {1: 10.0, 2: 7.0}, 100)
    _run(chooser, {1: 14.0, 2: 80.0}, 3000)
    assert chooser.in_use() == {8: 1}
    _run(chooser, {1: 10.0, 2: 7.0}, MAX_EXPLORE_EVERY + 10)
    assert chooser.in_use() == {8: 2}


def test_no_flapping_when_two_threads_do_not_pay() -> None:
    chooser = DecodeThreadChooser((1, 2))
    rng = random.Random(0)
    for _ in range(2000):  # batch 1: 2 threads ~5% slower, 10% noise on every step
        n = chooser.choose(1)
        chooser.record(1, n, (1.0 if n == 1 else 1.05) * rng.uniform(0.95, 1.05) / 1000)
    assert chooser.in_use() == {1: 1}
    assert chooser.switches <= 2


def test_buckets_are_independent() -> None:
    chooser = DecodeThreadChooser((1, 2))
    for _ in range(300):
        for batch, cost in ((1, {1: 3.0, 2: 3.5}), (8, {1: 10.0, 2: 7.0})):
            n = chooser.choose(batch)
            chooser.record(batch, n, cost[n] / 1000)
    assert chooser.in_use() == {1: 1, 8: 2}
    assert [bucket_of(b) for b in (1, 2, 3, 4, 7, 8, 31, 32)] == [1, 2, 2, 4, 4, 8, 16, 32]
    # 8x-wide token buckets; the prefill chooser's 4x-wide ones keep a 576-token prefill apart from a 2048-token
    # one (13% dearer per token) while 128-1023-token prefills still share two estimates, not four.
    assert [bucket_of(n, 3) for n in (65, 128, 511, 512, 1024, 4095, 4096)] == [64, 64, 64, 512, 512, 512, 4096]
    sizes = (65, 255, 256, 576, 1023, 1024, 2048, 4095, 4096)
    assert [bucket_of(n, 2) for n in sizes] == [64, 64, 256, 256, 256, 1024, 1024, 1024, 4096]


def test_wide_buckets_share_what_they_learn() -> None:
    """A chooser with 8x-wide buckets learns a size once for all the sizes of its bucket: after one bucket's
    steps of 128 and 256 tokens found one thread faster, a 384-token step runs on one thread with no probe."""
    chooser = DecodeThreadChooser((1, 2), bucket_bits=3)
    for tokens in (128, 256, 128, 256, 200, 300):
        n = chooser.choose(tokens)
        chooser.record(tokens, n, tokens * {1: 0.3e-3, 2: 1.0e-3}[n])
    assert chooser.choose(384) == 1 and chooser.in_use() == {64: 1}
    assert chooser.choose(1024) == 1 and 512 in chooser.in_use()  # a new bucket starts with its own first tries


def test_pinned_and_single_option_never_change() -> None:
    pinned = DecodeThreadChooser((2,), pinned=2)
    assert set(_run(pinned, {2: 50.0}, 50)) == {2} and pinned.describe() == "2 (pinned)"
    single = DecodeThreadChooser((1, 1))
    assert set(_run(single, {1: 5.0}, 50)) == {1} and single.describe() == "1" and not single.adaptive
    assert DecodeThreadChooser((1, 2)).describe() == "adaptive 1|2"


@settings(max_examples=30, deadline=None)
@given(fast=st.floats(1.0, 50.0), ratio=st.floats(1.3, 10.0), seed=st.integers(0, 2**16), two_faster=st.booleans())
def test_long_run_picks_the_faster_setting(fast: float, ratio: float, seed: int, two_faster: bool) -> None:
    """Whichever setting is >= 30% faster (10% noise per step) is the one in use after a while, and most
    steps ran on it."""
    rng = random.Random(seed)
    best, worst = (2, 1) if two_faster else (1, 2)
    cost = {best: fast, worst: fast * ratio}
    chooser = DecodeThreadChooser((1, 2))
    used = []
    for _ in range(400):
        n = chooser.choose(4)
        chooser.record(4, n, cost[n] * rng.uniform(0.95, 1.05) / 1000)
        used.append(n)
    assert chooser.in_use() == {4: best}
    assert used.count(best) >= 0.9 * len(used)


def test_a_uniform_slowdown_does_not_switch_on_a_stale_estimate() -> None:
    """Both settings get 50% slower (another process shares the core): the current one's rise must not make
    the chooser trust the other's estimate from before; it probes it and stays."""
    chooser = DecodeThreadChooser((1, 2))
    _run(chooser, {1: 10.0, 2: 12.0}, 200)
    assert chooser.in_use() == {8: 1}
    switches = chooser.switches
    used = _run(chooser, {1: 15.0, 2: 18.0}, 200)
    assert chooser.in_use() == {8: 1} and chooser.switches == switches
    assert used.count(2) <= 6


def test_most_first_tries_every_thread_before_one() -> None:
    # The prefill chooser: a bucket's first prefill (the first request of a size, the one a user times) runs on all
    # threads; one thread is tried next, then the faster one stays.
    chooser = DecodeThreadChooser((1, 2), label="Prefill", bucket_bits=2, most_first=True)
    first = chooser.choose(2048)
    assert first == 2
    chooser.record(2048, first, 0.2)
    second = chooser.choose(2048)
    assert second == 1
    chooser.record(2048, second, 0.4)
    assert chooser.choose(2048) == 2
    plain = DecodeThreadChooser((1, 2))
    assert plain.choose(1) == 1  # the decode choosers still start from one thread
