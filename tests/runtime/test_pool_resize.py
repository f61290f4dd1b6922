"""The two pools own their resizing: `take` / `give` / `resize` keep each pool's accounting whole, and
refuse what would corrupt it, so the elastic pool never edits their free lists itself."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.kvcache.page_pool import KVPagePool
from runtime.kvcache.state_pool import StateSlotPool


def test_kv_pool_resize_owns_the_given_pages_lowest_first() -> None:
    pool = KVPagePool(4, 2)
    pool.resize(10, [1, 3, 5, 7])
    assert pool.num_pages == pool.num_free == 4
    assert pool.alloc(2) == [1, 3]  # lowest first, as a fresh pool
    with pytest.raises(RuntimeError, match="in use"):
        pool.resize(10)
    with pytest.raises(RuntimeError, match="in use"):
        pool.take([1])
    pool.free([1, 3])
    with pytest.raises(ValueError, match="outside"):
        pool.resize(4, [2, 4])


def test_kv_pool_take_and_give_move_free_pages_only() -> None:
    pool = KVPagePool(8, 1)
    pool.take([6, 7])
    assert pool.num_pages == pool.num_free == 6 and sorted(pool.free_pages()) == list(range(6))
    with pytest.raises(RuntimeError, match="twice"):
        pool.give([5])  # still the pool's own
    pool.give([6, 7])
    assert pool.num_pages == 8 and sorted(pool.free_pages()) == list(range(8))


def test_state_pool_resize_take_give() -> None:
    pool = StateSlotPool(3, None)
    pool.resize(6, [4, 5])
    assert pool.num_slots == pool.num_free == 2 and pool.alloc() == 4
    with pytest.raises(RuntimeError, match="in use"):
        pool.take(4)
    with pytest.raises(RuntimeError, match="twice"):
        pool.give(5)
    pool.give(0)
    pool.take(5)
    assert pool.num_slots == 2 and sorted(pool.free_slots()) == [0]
    pool.free(4)
    assert sorted(pool.free_slots()) == [0, 4]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 15)), max_size=60))
def test_kv_pool_accounting_survives_any_sequence_of_moves(moves: list[tuple[bool, int]]) -> None:
    """free + in use == num_pages, and pages are owned at most once, whatever the elastic pool does."""
    pool = KVPagePool(16, 1)
    pool.resize(16, range(8))
    owned = set(range(8))
    held: list[int] = []
    for give, page in moves:
        if give and page not in owned:
            pool.give([page])
            owned.add(page)
        elif not give and page in owned and page not in held:
            if page % 3 == 0:  # some pages get allocated instead of moved
                got = pool.alloc(1)
                assert (got is None) == (len(held) == len(owned))
                if got is None:
                    continue
                assert got[0] in owned
                held.extend(got)
                continue
            pool.take([page])
            owned.discard(page)
        assert pool.num_pages == len(owned)
        assert pool.num_free + len(held) == pool.num_pages
        assert set(pool.free_pages()) | set(held) == owned
