"""The state-aware radix cache: match/insert/split/evict/lock on real pools and real state buffers."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.core.batch import PoolBuffers
from runtime.kvcache.page_pool import KVPagePool
from runtime.kvcache.radix_cache import RadixCache
from runtime.kvcache.state_pool import StateSlotPool


def make_cache(pages: int = 64, slots: int = 8, page_size: int = 1, dual_lru: bool = True) -> RadixCache:
    buffers = PoolBuffers(k=[], v=[], conv=[torch.zeros(slots, 2, 3)], ssm=[torch.zeros(slots, 2, 2, 2)])
    return RadixCache(
        KVPagePool(pages, page_size), StateSlotPool(slots, buffers), page_size=page_size, dual_lru=dual_lru
    )


def put(cache: RadixCache, tokens: list[int], state: bool = True) -> tuple[list[int], int | None]:
    """Insert like a request would: fresh pages for all tokens and (optionally) a fresh state slot."""
    pages = cache.kv_pool.alloc(len(tokens) // cache.page_size)
    assert pages is not None
    slot = cache.state_pool.alloc() if state else None
    res = cache.insert(tokens, pages, slot)
    cache.kv_pool.free(res.duplicate_pages)
    if slot is not None and not res.state_used:
        cache.state_pool.free(slot)
    return res.pages, (slot if res.state_used else None)


def test_match_stops_at_deepest_state_not_deepest_kv() -> None:
    c = make_cache()
    put(c, [1, 2, 3, 4])
    put(c, [1, 2, 3, 4, 5, 6, 7, 8], state=False)  # KV past the state, no state at its end
    m = c.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert m.length == 4 and m.state_slot is not None and len(m.pages) == 4
    assert c.match_prefix([1, 2, 3]).length == 0  # a partial node has no state at its end
    c.check_invariants()


def test_insert_splits_node_and_state_stays_on_lower_part() -> None:
    c = make_cache()
    pages_a, slot_a = put(c, [1, 2, 3, 4, 5, 6])
    pages_b, slot_b = put(c, [1, 2, 3, 9, 9])
    assert pages_b[:3] == pages_a[:3]  # shared prefix uses the tree's pages
    assert c.cached_pages == 8
    upper = c.root.children[(1,)]
    assert upper.key == (1, 2, 3) and upper.state_slot is None and len(upper.children) == 2
    assert c.match_prefix([1, 2, 3, 4, 5, 6, 7]).state_slot == slot_a
    assert c.match_prefix([1, 2, 3, 9, 9, 0]).state_slot == slot_b
    c.check_invariants()


def test_duplicate_pages_are_returned_to_the_caller() -> None:
    c = make_cache()
    put(c, [5, 6, 7])
    mine = c.kv_pool.alloc(3)
    assert mine is not None
    res = c.insert([5, 6, 7], mine, None)
    assert sorted(res.duplicate_pages) == sorted(mine) and not res.state_used
    c.kv_pool.free(res.duplicate_pages)
    assert c.kv_pool.num_free + c.cached_pages == 64


def test_locked_nodes_are_not_evicted_and_lru_order_is_kept() -> None:
    c = make_cache(pages=16)
    put(c, [1, 1, 1, 1])
    put(c, [2, 2, 2, 2])
    put(c, [3, 3, 3, 3])
    c.match_prefix([1, 1, 1, 1, 0])  # touch: 2 is now the oldest
    locked = c.match_prefix([3, 3, 3, 3, 0]).node
    c.lock(locked)
    assert c.evictable_pages == 8
    assert c.evict_kv(1) == 4
    assert c.match_prefix([2, 2, 2, 2, 0]).length == 0 and c.match_prefix([1, 1, 1, 1, 0]).length == 4
    assert c.evict_kv(100) == 4  # only the unlocked one is left to go
    assert c.match_prefix([3, 3, 3, 3, 0]).length == 4
    assert not c.flush()  # refused while locked
    c.unlock(locked)
    assert c.flush() and c.cached_pages == 0 and c.kv_pool.num_free == 16 and c.state_pool.num_free == 8
    c.check_invariants()


def test_dual_lru_evicts_states_independently_of_kv() -> None:
    c = make_cache(slots=4)
    put(c, [1, 2])
    put(c, [1, 2, 3, 4])  # [1,2] internal node with a state, [3,4] leaf with a state
    c.match_prefix([1, 2, 3, 4, 5])  # both touched in the same tick
    c.match_prefix([1, 2, 0])  # now [1,2]'s state is the most recent
    assert c.evict_states(1) == 1
    # the leaf's state went, and with it the leaf's KV; the internal node keeps KV and state
    assert c.cached_pages == 2 and c.cached_states == 1
    assert c.match_prefix([1, 2, 3, 4, 5]).length == 2
    c.check_invariants()


def test_internal_state_eviction_keeps_kv() -> None:
    c = make_cache(slots=4)
    put(c, [1, 2])
    put(c, [1, 2, 3, 4])
    c.match_prefix([1, 2, 3, 4, 5])  # leaf most recent; [1,2]'s state older
    assert c.evict_states(1) == 1
    assert c.cached_pages == 4 and c.cached_states == 1
    assert c.match_prefix([1, 2, 3, 4, 5]).length == 4
    assert c.match_prefix([1, 2, 9]).length == 0


def test_single_lru_frees_states_only_with_kv() -> None:
    c = make_cache(slots=4, dual_lru=False)
    put(c, [1, 2])
    put(c, [1, 2, 3, 4])
    assert c.evict_states(1) == 1
    assert c.cached_pages == 2  # the leaf's KV went with its state


def test_page_granularity() -> None:
    c = make_cache(pages=16, page_size=4)
    put(c, [1, 2, 3, 4, 5, 6, 7, 8])
    assert c.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 9]).length == 8
    # diverging inside the second page: only the first page is shared, and it has no state
    _, slot = put(c, [1, 2, 3, 4, 5, 6, 0, 0])
    assert c.cached_pages == 3 and slot is not None
    assert c.match_prefix([1, 2, 3, 4, 5, 6, 9, 9, 1]).length == 0
    c.check_invariants()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["ins", "match", "lock", "evict_kv", "evict_state"]),
            st.lists(st.integers(0, 3), min_size=1, max_size=8),
        ),
        max_size=30,
    )
)
def test_random_operations_keep_accounting(ops: list[tuple[str, list[int]]]) -> None:
    c = make_cache(pages=24, slots=6)
    locked = []
    for op, toks in ops:
        if op == "ins":
            if c.kv_pool.num_free < len(toks):
                c.evict_kv(len(toks) - c.kv_pool.num_free)
            if c.kv_pool.num_free < len(toks):
                continue
            if c.state_pool.num_free == 0:
                c.evict_states(1)
            put(c, toks, state=c.state_pool.num_free > 0)
        elif op == "match":
            c.match_prefix(toks)
        elif op == "lock":
            m = c.match_prefix(toks)
            if m.length:
                c.lock(m.node)
                locked.append(m.node)
        elif op == "evict_kv":
            c.evict_kv(len(toks))
        else:
            c.evict_states(len(toks))
        c.check_invariants()
        all_pages = c.all_pages() + c.kv_pool.free_pages()
        assert sorted(all_pages) == list(range(24))
        assert sorted(c.all_states() + c.state_pool.free_slots()) == list(range(6))
    for n in locked:
        c.unlock(n)
    assert c.flush()
    assert c.kv_pool.num_free == 24 and c.state_pool.num_free == 6
