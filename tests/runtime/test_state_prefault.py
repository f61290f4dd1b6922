"""Idle prefaulting of state slots (StateSlotPool.prefault, EngineCore.on_idle): the pools are allocated
untouched, so a fresh slot's first write (a request's copy of a cached state) faulted its pages in on the
request's path. While idle the engine zeroes the next free slots the allocator will hand out, never a slot in
use, never one already written, without changing which slot comes next."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from runtime.core.batch import ModelLayout
from runtime.core.buffers import allocate_pool_buffers
from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest, RequestOutput, SamplingParams
from runtime.engine.engine_core import EngineCore
from runtime.engine.engine_thread import ThreadedEngineClient, start_engine
from runtime.kvcache.page_pool import KVPagePool
from runtime.kvcache.state_pool import StateSlotPool

LAYOUT = ModelLayout(
    num_layers=2, attn_layer_ids=(1,), linear_layer_ids=(0,), num_kv_heads=1, head_dim=4, v_head_dim=4,
    conv_state_shape=(6, 3), ssm_state_shape=(2, 4, 4), vocab_size=16,
)  # fmt: skip


def _pool(slots: int) -> StateSlotPool:
    buffers = allocate_pool_buffers(LAYOUT, 8, slots)
    for t in (*buffers.conv, *buffers.ssm):
        t.fill_(7.0)  # what untouched memory may hold: prefault must zero it, and only where allowed
    return StateSlotPool(slots, buffers)


def _slot(pool: StateSlotPool, slot: int) -> torch.Tensor:
    return torch.cat([t.flatten() for t in pool.read(slot)])


def test_prefault_zeroes_only_free_never_written_slots_next_in_line() -> None:
    pool = _pool(6)
    a, b = pool.alloc(), pool.alloc()
    assert a is not None and b is not None
    pool.zero(a)
    pool.buffers.ssm[0][a].fill_(5.0)  # type: ignore[union-attr]  # a running request's state
    pool.copy(a, b)
    order = list(reversed(pool.free_slots()))  # the order alloc will hand them out
    assert pool.prefault(3) == 3
    for slot in order[:3]:
        assert torch.count_nonzero(_slot(pool, slot)) == 0
    for slot in order[3:]:
        assert torch.all(_slot(pool, slot) == 7.0), "a slot beyond the count was touched"
    assert torch.all(pool.buffers.ssm[0][a] == 5.0) and torch.all(pool.buffers.ssm[0][b] == 5.0)  # type: ignore[union-attr]
    assert pool.prefault(3) == 0  # already done
    pool.free(a)  # written before: back on top of the stack, left as it is
    assert pool.prefault(1) == 0 and torch.all(pool.buffers.ssm[0][a] == 5.0)  # type: ignore[union-attr]
    assert [pool.alloc() for _ in range(3)] == [a, *order[:2]]  # prefault never reorders the free list


def _bulk_idle_work_done(
    client: ThreadedEngineClient,
    ready: Callable[[EngineCore], bool],
    passes: list[bool] | None = None,
    before_bulk: Callable[[Callable[[], bool]], None] | None = None,
) -> threading.Event:
    """Set once the engine thread's bulk idle work (on_idle without next_only) returns with `ready(core)` true.
    Waited on instead of polling through call_in_engine: each query is a command, and a command interrupts the
    bulk prefault (it resumes at the next idle wait, but a poll loop keeps catching it mid-way). `passes` gets each
    bulk pass's result (finished or interrupted); `before_bulk(interrupted)` runs before each bulk pass."""
    core = client.core
    done = threading.Event()
    on_idle = core.on_idle

    def watched(interrupted: Callable[[], bool], *, next_only: bool = False) -> bool:
        if not next_only and before_bulk is not None:
            before_bulk(interrupted)
        finished = on_idle(interrupted, next_only=next_only)
        if not next_only:
            if passes is not None:
                passes.append(finished)
            if ready(core):
                done.set()
        return finished

    core.on_idle = watched  # type: ignore[method-assign]
    return done


def test_the_idle_engine_has_its_next_slots_faulted_in(demo_model_dir: Path) -> None:
    client = start_engine(EngineArgs(model_path=str(demo_model_dir), memory_budget_gib=0.5))
    try:
        done: list[RequestOutput] = []
        params = SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True)
        finished = threading.Event()

        def on_output(out: RequestOutput) -> None:
            if out.finished:
                done.append(out)
                finished.set()

        idle_done = _bulk_idle_work_done(
            client, lambda core: bool(done) and not core.cache.state_pool.next_unwritten(core.idle_prefault_slots())
        )
        client.add_request(GenerateRequest("p", list(range(10, 60)), params), on_output)
        assert finished.wait(120)
        # Once the engine has gone idle after the request, nothing is left to fault in. Awaited, not polled: a
        # query is a command, and a command interrupts the idle work (which then waits for the next busy spell).
        assert idle_done.wait(120), "the idle engine never finished faulting in its next slots"
        left = client.call_in_engine(lambda core: core.cache.state_pool.next_unwritten(core.idle_prefault_slots()))
        assert left == []
    finally:
        client.shutdown()


def test_idle_work_a_command_interrupts_is_taken_up_again(demo_model_dir: Path) -> None:
    """A command that arrives during the bulk idle work (a monitor's /server_info) stops it, and the engine takes it
    up again at its next idle wait, with no request in between: a server polled every few seconds still has its
    next slots ready when traffic comes."""
    client = start_engine(EngineArgs(model_path=str(demo_model_dir), memory_budget_gib=0.5))
    try:
        results: list[bool] = []  # each bulk pass's return: done or interrupted
        queries: list[threading.Thread] = []

        def query_arrives(interrupted: Callable[[], bool]) -> None:
            if results:
                return
            # The first bulk pass: a query arrives as it starts (from another thread, as the HTTP loop's do).
            query = threading.Thread(target=client.call_in_engine, args=(lambda c: c.stats(),), daemon=True)
            query.start()
            queries.append(query)
            deadline = time.monotonic() + 60
            while not interrupted() and time.monotonic() < deadline:
                time.sleep(0.001)

        resumed = _bulk_idle_work_done(
            client,
            lambda core: (
                bool(results) and results[-1] and not core.cache.state_pool.next_unwritten(core.idle_prefault_slots())
            ),
            passes=results,
            before_bulk=query_arrives,
        )
        finished = threading.Event()
        params = SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True)

        def on_output(out: RequestOutput) -> None:
            if out.finished:
                finished.set()

        client.add_request(GenerateRequest("p", list(range(10, 60)), params), on_output)
        assert finished.wait(120)
        assert resumed.wait(120), f"the interrupted idle work was not taken up again (bulk passes: {results})"
        assert results[0] is False and results[-1] is True  # really interrupted once, then finished
        queries[0].join(60)
        assert not queries[0].is_alive()
    finally:
        client.shutdown()


def test_going_idle_readies_just_the_next_slot_at_once(demo_model_dir: Path) -> None:
    """The engine thread calls on_idle(next_only=True) the moment it goes idle (the bulk waits): exactly the slot
    the next request takes is faulted in, and the free list's order is kept."""
    core = EngineCore(EngineArgs(model_path=str(demo_model_dir), memory_budget_gib=0.5))
    pool = core.cache.state_pool
    ahead = core.idle_prefault_slots()
    before = pool.next_unwritten(ahead)
    assert ahead > 1 and len(before) == ahead
    core.on_idle(lambda: False, next_only=True)
    assert pool.next_unwritten(1) == []
    assert pool.next_unwritten(ahead) == before[1:]
    assert pool.alloc() == before[0]


def test_prefault_stops_when_asked_and_leaves_unfinished_slots_for_later() -> None:
    pool = _pool(5)
    asked = 0

    def stop_after_three() -> bool:  # a request arrives after three layer tensors
        nonlocal asked
        asked += 1
        return asked > 3

    first = pool.next_unwritten(4)
    assert pool.prefault(4, stop_after_three) == 1  # slot 1 has two tensors (conv, ssm): done; slot 2 half
    assert pool.next_unwritten(4) == first[1:]
    assert pool.prefault(4) == 3 and pool.next_unwritten(4) == []


def test_idle_reserve_grows_to_what_a_busy_spell_took_and_a_request_interrupts_it(demo_model_dir: Path) -> None:
    """Before traffic the idle engine readies only its fixed floor (start-up memory must not grow); after a long
    prompt that took more slots (its checkpoints), the idle reserve is that many, faulted in in allocation order;
    a request arriving mid-way stops it, loses no cached state, and the reserve is finished at the next idle."""
    core = EngineCore(EngineArgs(model_path=str(demo_model_dir), memory_budget_gib=0.5, mamba_track_interval=8))
    pool = core.cache.state_pool
    floor = core.idle_prefault_slots()
    core.on_idle(lambda: False)
    assert len(pool.next_unwritten(pool.num_free)) == pool.num_free - floor  # only the floor, not the pool

    params = SamplingParams(temperature=0, max_new_tokens=3, ignore_eos=True)
    prompt = [(7 * i) % 4000 + 10 for i in range(600)]

    def run(rid: str, ids: list[int]) -> list[int]:
        out: list[RequestOutput] = []
        core.scheduler.add_request(GenerateRequest(rid, ids, params), out.append)
        while core.scheduler.has_work:
            core.step()
        return [t for o in out for t in o.new_token_ids]

    handed = pool.handed_out
    first = run("long", prompt)
    took = pool.handed_out - handed
    assert took > floor, "the prompt should take more slots (checkpoints) than the pre-traffic floor"
    want = pool.next_unwritten(took)
    assert len(want) > floor

    asked = 0
    assert pool.buffers is not None
    per_slot = len(pool.buffers.conv) + len(pool.buffers.ssm) + len(pool.extra)  # tensors zeroed per slot

    def arrives_mid_slot() -> bool:  # a request arrives half-way through the second slot
        nonlocal asked
        asked += 1
        return asked > per_slot + 1

    core.on_idle(arrives_mid_slot)
    assert core.idle_prefault_slots() == took
    assert pool.next_unwritten(took) == want[1:]  # stopped part-way: one slot done, the second left for later

    assert run("again", prompt) == first  # the cached prefix and its states survived the prefault
    core.check_invariants()
    core.on_idle(lambda: False)
    assert pool.next_unwritten(core.idle_prefault_slots()) == []
    kv = core.pools.buffers
    assert core.cache.kv_pool.prefault(len(prompt), [*kv.k, *kv.v]) == 0  # the KV pages it wrote: ready too


def test_kv_prefault_zeroes_only_the_fresh_pages_next_in_line() -> None:
    """KVPagePool.prefault: the pages a cold prompt will be handed after the stack's, in every buffer; never a
    page in use or on the stack, never past `count`, the hand-out order unchanged, stoppable between runs."""
    pool = KVPagePool(num_pages=12, page_size=2)
    kv = [torch.full((24, 3), 7.0), torch.full((24, 5), 7.0)]
    held = pool.alloc(3)  # pages 0-2 in use
    assert held == [0, 1, 2]
    pool.free([1])  # page 1 back on the stack: handed out first
    assert pool.prefault(4, kv) == 3  # the next four: page 1 (stack), then fresh 3, 4, 5
    for t in kv:
        assert torch.all(t[6:12] == 0)  # pages 3-5
        assert torch.all(t[:6] == 7.0) and torch.all(t[12:] == 7.0)  # in use, on the stack, or beyond the count
    assert pool.prefault(4, kv) == 0  # done already
    assert pool.prefault(6, kv, stop=lambda: True) == 0  # a request arrived: nothing more now
    assert pool.prefault(6, kv) == 2 and torch.all(kv[0][12:16] == 0) and torch.all(kv[1][16:] == 7.0)
    assert pool.alloc(3) == [1, 3, 4]  # order unchanged


def test_held_idle_work_faults_nothing_in_and_the_held_spell_is_no_traffic(demo_model_dir: Path) -> None:
    """The server holds idle work over its start-up warm-up: meanwhile nothing is faulted in (not even the next
    slot), and once released the warm-up does not size the idle reserve; only the pre-traffic floor is readied."""
    args = EngineArgs(model_path=str(demo_model_dir), memory_budget_gib=0.5, mamba_track_interval=8)
    client = start_engine(args)
    try:
        floor = client.call_in_engine(lambda core: core.idle_prefault_slots())
        client.hold_idle_work(True)
        finished = threading.Event()
        params = SamplingParams(temperature=0, max_new_tokens=3, ignore_eos=True)
        prompt = [(7 * i) % 4000 + 10 for i in range(600)]  # takes more slots (checkpoints) than the floor
        client.add_request(GenerateRequest("w", prompt, params), lambda o: finished.set() if o.finished else None)
        assert finished.wait(120)

        def unwritten(core: EngineCore) -> list[int]:
            return core.cache.state_pool.next_unwritten(core.cache.state_pool.num_free)

        held = client.call_in_engine(unwritten)
        time.sleep(0.3)  # well past the engine's idle-work delay
        assert client.call_in_engine(unwritten) == held, "idle work ran while held"
        assert client.flush_cache()
        idle_done = _bulk_idle_work_done(client, lambda core: not core.cache.state_pool.next_unwritten(floor))
        client.hold_idle_work(False)
        assert idle_done.wait(120), "released, the idle engine never faulted in its floor"  # awaited, as above
        assert client.call_in_engine(lambda core: core.cache.state_pool.next_unwritten(floor)) == []
        assert client.call_in_engine(lambda core: core.idle_prefault_slots()) == floor
    finally:
        client.shutdown()
