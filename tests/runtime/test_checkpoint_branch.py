"""The branch point: how far the tree's KV for a prompt goes past its deepest state (whole pages), which the
request then checkpoints — on the radix tree alone and through CacheManager.admit/commit_checkpoint."""

from __future__ import annotations

import torch

from runtime.core.batch import PoolBuffers
from runtime.kvcache.cache_manager import CacheManager
from runtime.kvcache.page_pool import KVPagePool
from runtime.kvcache.state_pool import StateSlotPool
from tests.runtime.test_radix_cache import make_cache, put


def test_kv_length_counts_whole_nodes_and_partial_pages() -> None:
    c = make_cache(page_size=2)
    put(c, [1, 2, 3, 4])
    put(c, [1, 2, 3, 4, 5, 6, 7, 8], state=False)
    m = c.match_prefix([1, 2, 3, 4, 5, 6, 7, 9, 9])
    assert (m.length, m.kv_length) == (4, 6)  # [7, 8] vs [7, 9]: the page is not whole
    m = c.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert (m.length, m.kv_length) == (4, 8)
    assert c.match_prefix([5, 6]).kv_length == 0
    none = c.match_prefix([1, 2, 3])  # KV but no state on the way: nothing usable, the branch still known
    assert (none.length, none.kv_length) == (0, 2)


def _manager(page_size: int = 1) -> CacheManager:
    buffers = PoolBuffers(k=[], v=[], conv=[torch.zeros(8, 2, 3)], ssm=[torch.zeros(8, 2, 2, 2)])
    return CacheManager(
        KVPagePool(64, page_size),
        StateSlotPool(8, buffers),
        radix_enabled=True,
        dual_lru=True,
        snapshot_on_match=True,
        copy_on_write=True,
    )


def test_admit_records_the_branch_point_and_commit_caches_it() -> None:
    cm = _manager()
    doc = [1, 2, 3, 4, 5, 6]
    _, first = cm.admit(doc + [7, 8], total_tokens=9)
    assert first is not None and first.branch_len == 0
    cm.grow(first, 8)
    first.kv_len = 8
    cm.release(first, doc + [7, 8], cache=True)  # end state after 8 tokens only
    cm.check_invariants()

    prompt = doc + [9, 9]
    ok, second = cm.admit(prompt, total_tokens=9)
    assert ok.ok and second is not None and ok.cached_tokens == 0 and second.branch_len == len(doc)
    cm.grow(second, len(prompt))
    second.kv_len = len(prompt)
    slot = cm.take_checkpoint_slot()
    assert slot is not None
    assert cm.commit_checkpoint(second, prompt, len(doc), slot)
    assert second.tree_len == len(doc)  # its first 6 pages are now the tree's (duplicates freed)
    cm.check_invariants()
    cm.release(second, prompt, cache=True)
    cm.check_invariants()

    ok, third = cm.admit(doc + [4, 4], total_tokens=9)
    assert ok.ok and third is not None and ok.cached_tokens == len(doc) and third.branch_len == 0
    cm.release(third, doc + [4, 4], cache=False)
    cm.check_invariants()


def test_commit_refuses_a_position_it_cannot_cache() -> None:
    cm = _manager(page_size=2)
    _, mem = cm.admit([1, 2, 3, 4, 5, 6], total_tokens=7)
    assert mem is not None
    cm.grow(mem, 6)
    mem.kv_len = 6
    free_before = cm.state_pool.num_free
    slot = cm.take_checkpoint_slot()
    assert slot is not None
    assert not cm.commit_checkpoint(mem, [1, 2, 3, 4, 5, 6], 3, slot)  # not a whole page: slot goes back
    assert cm.state_pool.num_free == free_before
    cm.release(mem, [1, 2, 3, 4, 5, 6], cache=False)
    cm.check_invariants()


def _tree_dump(cm: CacheManager) -> list[tuple]:
    """Every node (depth first): key, pages, state slot, locks, and the access stamps' ranks (their order)."""
    nodes, stack = [], [cm.tree.root]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children[k] for k in sorted(node.children, reverse=True))
    kv_rank = {t: i for i, t in enumerate(sorted({n.kv_access for n in nodes}))}
    state_rank = {t: i for i, t in enumerate(sorted({n.state_access for n in nodes}))}
    return [
        (n.key, list(n.pages), n.state_slot, n.lock_ref, kv_rank[n.kv_access], state_rank[n.state_access])
        for n in nodes
    ]


def _chunk_commit(batched: bool) -> tuple[CacheManager, list[tuple], list[int], int, int]:
    """A cached 4-token prompt (its pages differ from the next request's: duplicates), then a 12-token prompt
    that shares it, computed as one chunk, committing checkpoints at 2 (the tree has KV there, no state), 4 (a state
    there already: slot back), 6, 7 (not a whole page: slot back), 8 and 12."""
    cm = _manager(page_size=2)
    _, first = cm.admit([1, 2, 3, 4, 5], total_tokens=6)
    assert first is not None
    cm.grow(first, 4)
    first.kv_len = 4
    cm.release(first, [1, 2, 3, 4, 5], cache=True)
    prompt = [1, 2, 3, 4, 9, 9, 8, 8, 7, 7, 6, 6]
    _, mem = cm.admit(prompt, total_tokens=13, max_prefix=0)  # computes everything again: its own pages
    assert mem is not None and mem.tree_len == 0
    cm.grow(mem, len(prompt))
    mem.kv_len = len(prompt)
    points = []
    for n in (2, 4, 6, 7, 8, 12):
        slot = cm.take_checkpoint_slot()
        assert slot is not None
        points.append((n, slot))
    if batched:
        taken = cm.commit_checkpoints(mem, prompt, points)
    else:
        taken = sum(cm.commit_checkpoint(mem, prompt, n, slot) for n, slot in points)
    cm.check_invariants()
    return cm, _tree_dump(cm), list(mem.pages), mem.tree_len, taken


def test_commit_checkpoints_builds_the_tree_the_single_commits_build() -> None:
    one_by_one, batched = _chunk_commit(batched=False), _chunk_commit(batched=True)
    assert batched[1:] == one_by_one[1:]
    assert batched[4] == 4  # 2, 6, 8, 12 (4 already had a state, 7 is not a whole page)
    assert batched[0].state_pool.num_free == one_by_one[0].state_pool.num_free
    assert batched[0].kv_pool.num_free == one_by_one[0].kv_pool.num_free
