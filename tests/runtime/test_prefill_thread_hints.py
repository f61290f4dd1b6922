"""The prefill thread chooser's host hints (runtime/engine/decode_threads.py, runtime/engine/host_load.py): per-step
wall times and host headroom come from a simulated host whose load the test changes; the /proc/stat arithmetic
is checked on texts and on this machine's own /proc/stat."""

from __future__ import annotations

import os
import sys

import pytest

from runtime.engine import host_load
from runtime.engine.decode_threads import EXPLORE_EVERY, EXPLORE_STEPS, MAX_HINT_GAP, DecodeThreadChooser
from runtime.engine.host_load import CpuClocks, headroom, parse_busy_seconds

TOKENS = 2048  # one prefill per step
QUIET = {1: 0.39, 2: 0.215}  # peer model, 2048 tokens, 2-core host: seconds per prefill
BUSY = {1: 0.40, 2: 0.66}  # another process holds a core


def _prefills(chooser: DecodeThreadChooser, cost: dict[int, float], room: float | None, steps: int) -> list[int]:
    used = []
    for _ in range(steps):
        n = chooser.choose(TOKENS)
        chooser.record(TOKENS, n, cost[n], room)
        used.append(n)
    return used


def _learnt_one_thread_on_a_busy_moment(host_hints: bool) -> DecodeThreadChooser:
    """The bucket's first prefill on one thread, its first two-thread one on a busy moment: one thread wins."""
    chooser = DecodeThreadChooser((1, 2), label="Prefill", bucket_bits=2, host_hints=host_hints)
    assert _prefills(chooser, BUSY, room=1.0, steps=2) == [1, 2]
    assert chooser.in_use() == {1024: 1}
    return chooser


def test_without_a_hint_one_busy_probe_stands_for_many_quiet_prefills() -> None:
    """What made cold TTFT bimodal per server process: one thread's time barely moves when the host quiets
    down, so nothing but the periodic probe revisits two threads, EXPLORE_EVERY prefills later."""
    chooser = _learnt_one_thread_on_a_busy_moment(host_hints=False)
    used = _prefills(chooser, QUIET, room=None, steps=EXPLORE_EVERY)
    assert used == [1] * EXPLORE_EVERY


def test_a_quiet_host_brings_two_threads_back_on_the_next_prefill() -> None:
    chooser = _learnt_one_thread_on_a_busy_moment(host_hints=True)
    used = _prefills(chooser, QUIET, room=2.0, steps=6)
    # One prefill on one thread shows the free core; the probe's first prefill is 1.8x faster: taken at once.
    assert used == [1, 2, 2, 2, 2, 2] and chooser.in_use() == {1024: 2}


def test_cores_freed_between_prefills_bring_two_threads_back_before_the_next_one() -> None:
    """The host quieted down between two prefills (the harness's warm and repeat requests ran in between): the
    next prefill already probes two threads; cores still busy in between do not."""
    chooser = _learnt_one_thread_on_a_busy_moment(host_hints=True)
    assert chooser.choose(TOKENS, gap_room=1.2) == 1
    used = []
    for _ in range(EXPLORE_STEPS):
        used.append(chooser.choose(TOKENS, gap_room=1.9))
        chooser.record(TOKENS, used[-1], QUIET[used[-1]], 1.9)
    assert used == [2] * EXPLORE_STEPS and chooser.in_use() == {1024: 2}
    # Never the other way before a step: two threads' estimate from a quiet time would judge a one-thread probe.
    assert chooser.choose(TOKENS, gap_room=0.5) == 2


def test_a_busy_host_moves_two_threads_to_one_at_once_and_a_busy_probe_costs_one_prefill() -> None:
    chooser = DecodeThreadChooser((1, 2), bucket_bits=2, host_hints=True)
    assert _prefills(chooser, QUIET, room=2.0, steps=10) == [1] + [2] * 9  # no periodic probe yet
    assert chooser.in_use() == {1024: 2}
    # The first prefill on two threads that lost its second core starts a probe of one thread: faster, taken.
    used = _prefills(chooser, BUSY, room=1.0, steps=EXPLORE_STEPS + 2)
    assert used[:2] == [2, 1] and chooser.in_use() == {1024: 1}
    # Periodic probes of two threads on the busy host end after one slow prefill each.
    used = _prefills(chooser, BUSY, room=1.0, steps=400)
    probes = [i for i, n in enumerate(used) if n == 2]
    assert all(i + 1 not in probes for i in probes) and len(probes) <= 6, probes


def test_hints_that_the_times_contradict_back_off() -> None:
    """A CPU quota that /proc/stat does not show: the host looks free, two threads are still slower. Hinted
    probes come every 1, 2, 4, ... MAX_HINT_GAP steps, then no more often than that."""
    chooser = DecodeThreadChooser((1, 2), bucket_bits=2, host_hints=True)
    steps = 2000
    used = _prefills(chooser, BUSY, room=2.0, steps=steps)
    assert chooser.in_use() == {1024: 1}
    probes = used.count(2)
    assert probes <= EXPLORE_STEPS * (MAX_HINT_GAP.bit_length() + steps // MAX_HINT_GAP), probes
    assert used[-MAX_HINT_GAP:].count(2) <= EXPLORE_STEPS


def test_no_hint_without_a_reading() -> None:
    """A step with no reading (short, or no /proc/stat) leaves the chooser to its times alone."""
    chooser = _learnt_one_thread_on_a_busy_moment(host_hints=True)
    assert _prefills(chooser, QUIET, room=None, steps=EXPLORE_EVERY) == [1] * EXPLORE_EVERY


def test_busy_seconds_from_proc_stat_text() -> None:
    text = "cpu  100 20 30 400 50 6 7 8 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"
    # user nice system irq softirq steal = 100+20+30+6+7+8; idle and iowait are not busy.
    assert parse_busy_seconds(text, tick_s=0.01) == pytest.approx(1.71)
    with pytest.raises(ValueError):
        parse_busy_seconds("intr 1 2 3\n")


def test_headroom_is_the_cores_other_processes_left() -> None:
    before = CpuClocks(host_busy_s=10.0, own_s=1.0, wall_s=100.0)
    # 0.2 s: the host ran 0.55 core-seconds, 0.35 of them ours: others held one core on average.
    after = CpuClocks(host_busy_s=10.55, own_s=1.35, wall_s=100.2)
    assert headroom(before, after, cores=2) == pytest.approx(1.0)
    assert headroom(before, CpuClocks(10.2, 1.2, 100.2), cores=2) == pytest.approx(2.0)  # ours alone
    assert headroom(before, CpuClocks(11.0, 1.0, 100.2), cores=2) == 0.0  # clamped: tick rounding
    short = CpuClocks(10.01, 1.01, 100.0 + host_load.MIN_WALL_S / 2)
    assert headroom(before, short, cores=2) is None and headroom(None, after) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat")
def test_this_hosts_clocks_read_and_bound_the_headroom() -> None:
    before = host_load.read_clocks()
    assert before is not None
    x = 0
    while host_load.read_clocks().wall_s - before.wall_s < 2 * host_load.MIN_WALL_S:  # type: ignore[union-attr]
        x += 1  # this process busy on one core
    room = headroom(before, host_load.read_clocks())
    assert room is not None and 0.0 <= room <= (os.cpu_count() or 1)
    assert host_load.read_clocks(host_load.Path("/nonexistent/stat")) is None


def test_most_first_with_hints_never_probes_one_thread_on_an_idle_host() -> None:
    """The served prefill chooser: every thread from the first prefill on; the one-thread probe (a whole prefill at
    half speed) only once a step shows the host short of a core, and then the faster count is kept."""
    chooser = DecodeThreadChooser((1, 2), label="Prefill", bucket_bits=2, host_hints=True, most_first=True)
    assert _prefills(chooser, QUIET, room=2.0, steps=EXPLORE_EVERY + 2) == [2] * (EXPLORE_EVERY + 2)
    used = _prefills(chooser, BUSY, room=1.0, steps=4)
    assert used[0] == 2 and 1 in used[1:]  # the busy step starts the probe of one thread
    assert chooser.in_use() == {1024: 1}
