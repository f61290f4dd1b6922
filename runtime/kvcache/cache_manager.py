"""What a request holds in the two pools, and every move between request, prefix cache and free lists.

A request's KV pages cover its tokens [0, kv_len); the first `tree_len` tokens' pages belong to the prefix
cache (locked through `node`), the rest are private. Its state slot is always private. Pages a request may
still need (up to prompt + max_new_tokens) are reserved at admission, so decode never runs out of KV: a
request that cannot get its reservation waits in the queue instead.

Accounting: free + cached + in-use == total, for KV pages and for state slots (`check_invariants`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from runtime.kvcache.page_list import PageList
from runtime.kvcache.page_pool import KVPagePool
from runtime.kvcache.radix_cache import InsertResult, RadixCache, RadixNode
from runtime.kvcache.state_pool import StateSlotPool

logger = logging.getLogger("runtime.kvcache")


@dataclass
class ReqMemory:
    pages: list[int] = field(default_factory=PageList)  # always a PageList (see __setattr__)
    tree_len: int = 0  # tokens whose pages belong to the cache (a multiple of page_size)
    node: RadixNode | None = None  # locked node ending at tree_len (None: nothing locked)
    slot: int | None = None  # private state slot: the state after kv_len tokens
    kv_len: int = 0  # tokens whose KV and state are computed
    reserved_pages: int = 0  # pages still to allocate, at most, over the request's life
    # Where the tree's KV for this prompt ends without a state (0: nowhere past the match): checkpointing the
    # state there lets the next request that branches off at the same place resume from it.
    branch_len: int = 0

    def __setattr__(self, name: str, value: object) -> None:
        if name == "pages" and not isinstance(value, PageList):
            value = PageList(value)
        super().__setattr__(name, value)


class Admission:
    """Why a request was not admitted: `wait` (retry later) or `fail` (it can never fit; message says why)."""

    def __init__(self, ok: bool, message: str = "", cached_tokens: int = 0) -> None:
        self.ok = ok
        self.message = message
        self.cached_tokens = cached_tokens


class CacheManager:
    def __init__(
        self,
        kv_pool: KVPagePool,
        state_pool: StateSlotPool,
        *,
        radix_enabled: bool,
        dual_lru: bool,
        snapshot_on_match: bool,
        copy_on_write: bool,
    ) -> None:
        self.kv_pool = kv_pool
        self.state_pool = state_pool
        self.page_size = kv_pool.page_size
        self.tree = RadixCache(kv_pool, state_pool, page_size=self.page_size, dual_lru=dual_lru)
        self.radix_enabled = radix_enabled
        self.snapshot_on_match = snapshot_on_match
        self.copy_on_write = copy_on_write
        # Without snapshots nothing cached could ever be reused: do not spend slots and copies on it.
        self.caching = radix_enabled and snapshot_on_match
        self.reserved_pages = 0  # sum over admitted requests
        self.live: list[ReqMemory] = []

    # -- sizes -----------------------------------------------------------------------------------------------

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    @property
    def available_pages(self) -> int:
        """Pages a new request could still be promised: free + evictable − already promised."""
        return self.kv_pool.num_free + self.tree.evictable_pages - self.reserved_pages

    @property
    def available_slots(self) -> int:
        return self.state_pool.num_free + self.tree.evictable_states

    # -- allocation with eviction ----------------------------------------------------------------------------

    def _alloc_pages(self, n: int) -> list[int]:
        if self.kv_pool.num_free < n:
            self.tree.evict_kv(n - self.kv_pool.num_free)
        pages = self.kv_pool.alloc(n)
        if pages is None:  # reservations make this impossible; failing loudly beats corrupting the cache
            raise RuntimeError(f"KV pool exhausted under reservation: need {n}, {self.kv_pool.num_free} free")
        return pages

    def _alloc_slot(self, keep: RadixNode | None = None) -> int | None:
        if self.state_pool.num_free == 0 and self.radix_enabled:
            self.tree.evict_states(1, keep=keep)
        return self.state_pool.alloc()

    # -- request life ----------------------------------------------------------------------------------------

    def admit(
        self, prompt: list[int], total_tokens: int, max_prefix: int | None = None
    ) -> tuple[Admission, ReqMemory | None]:
        """Match the prompt in the cache and take a state slot and a KV reservation for `total_tokens` tokens.
        `max_prefix` caps the reused prefix (prompt logprobs need the logits of the positions after it).

        Returns (ok, memory) or (wait) or (fail with a message). Nothing is held unless ok.
        """
        need_pages = self.pages_for(total_tokens)
        if need_pages > self.kv_pool.num_pages:
            return Admission(False, _kv_too_small(total_tokens, self.kv_pool), 0), None
        if self.state_pool.num_slots < 1:
            return Admission(False, _state_too_small(self.state_pool), 0), None
        match = None
        branch_len = 0
        if self.caching:
            # At least one prompt token is always computed: its logits give the first output token.
            limit = len(prompt) - 1 if max_prefix is None else min(len(prompt) - 1, max_prefix)
            match = self.tree.match_prefix(prompt[:limit])
            branch_len = match.kv_length if match.kv_length > match.length else 0
            if match.length == 0:
                match = None
        if match is not None:
            self.tree.lock(match.node)
        new_pages = need_pages - (len(match.pages) if match else 0)
        # A hit always yields a slot: a copy, or (nothing free) the cached state itself.
        if new_pages > self.available_pages or (match is None and self.available_slots < 1):
            if match is not None:
                self.tree.unlock(match.node)
            return Admission(False), None
        mem = ReqMemory(branch_len=branch_len)
        if match is not None:
            mem.pages = list(match.pages)
            mem.tree_len = mem.kv_len = match.length
            mem.node = match.node
            mem.slot = self._take_matched_state(match.node)
        else:
            mem.slot = self._alloc_slot()
            assert mem.slot is not None
            self.state_pool.zero(mem.slot)
        mem.reserved_pages = new_pages
        self.reserved_pages += new_pages
        self.live.append(mem)
        return Admission(True, cached_tokens=mem.kv_len), mem

    def _take_matched_state(self, node: RadixNode) -> int:
        """The request's own copy of the node's state; without copy-on-write, the cached slot itself."""
        src = node.state_slot
        assert src is not None
        if self.copy_on_write:
            slot = self._alloc_slot(keep=node)
            if slot is not None:
                self.state_pool.copy(src, slot)
                return slot
        # No copy-on-write, or no other slot to copy into: the request takes the cached state over and the
        # cache forgets it (it will be written in place).
        self.tree.detach_state(node)
        return src

    def fork(self, mem: ReqMemory, tokens: list[int], total_tokens: int) -> ReqMemory | None:
        """A second request continuing from `mem` (which holds tokens[:kv_len], prefilled): the KV is shared
        through the tree (the tokens go in, locked by both) and the state slot is copied. `total_tokens` is the
        new request's final length, as at admission. None when it cannot be shared now (caching off, the
        prompt ends inside a page, no slot or pages free): the caller admits it the ordinary way."""
        ps = self.page_size
        if not self.caching or mem.kv_len % ps or mem.slot is None:
            return None
        need = self.pages_for(total_tokens) - mem.kv_len // ps
        if need > self.available_pages or self.available_slots < 1:
            return None
        if mem.kv_len > mem.tree_len:
            self._insert(mem, tokens, None)  # the prompt's KV now belongs to the tree, locked through mem.node
        slot = self._alloc_slot(keep=mem.node)
        if slot is None:
            return None
        self.state_pool.copy(mem.slot, slot)
        child = ReqMemory(
            pages=list(mem.pages), tree_len=mem.kv_len, node=mem.node, slot=slot, kv_len=mem.kv_len,
            reserved_pages=need,
        )  # fmt: skip
        if child.node is not None:
            self.tree.lock(child.node)
        self.reserved_pages += need
        self.live.append(child)
        return child

    def grow(self, mem: ReqMemory, new_tokens: int) -> list[int]:
        """KV token slots for the next `new_tokens` tokens (allocating pages from the reservation)."""
        ps = self.page_size
        end = mem.kv_len + new_tokens
        missing = self.pages_for(end) - len(mem.pages)
        if missing > 0:
            mem.pages.extend(self._alloc_pages(missing))
            mem.reserved_pages -= missing
            self.reserved_pages -= missing
        if ps == 1:  # a token's slot is its page (a 2048-token chunk: ~0.1 ms less than the loop below)
            return list.__getitem__(mem.pages, slice(mem.kv_len, end))
        return [mem.pages[t // ps] * ps + t % ps for t in range(mem.kv_len, end)]

    def grow_for_decode(self, mems: list[ReqMemory]) -> tuple[list[int], list[torch.Tensor]]:
        """One decode step's memory: a slot for each sequence's next token (allocated), and each sequence's KV
        slots including it, as int64 tensors. When a page is a token, each request's page list keeps its tensor
        up to date (runtime/kvcache/page_list.py): one element written per step instead of O(context) work."""
        news = [self.grow(mem, 1) for mem in mems]
        out_locs = [slot for new in news for slot in new]
        if self.page_size == 1:  # a token's slot is its page: the row is pages[: kv_len + 1], kept as a tensor
            return out_locs, [mem.pages.as_tensor(mem.kv_len + 1) for mem in mems]  # type: ignore[attr-defined]
        return out_locs, [
            torch.cat([self.token_slots(mem, mem.kv_len), torch.tensor(new, dtype=torch.int64)])
            for mem, new in zip(mems, news, strict=True)
        ]

    def truncate(self, mem: ReqMemory, kv_len: int) -> int:
        """The request keeps the KV of its first `kv_len` tokens (a verify round rejected the rest): pages past
        them go back into its reservation, so the pages it may still need stay promised. Returns pages freed."""
        mem.kv_len = kv_len
        keep = self.pages_for(kv_len)
        tail = mem.pages[keep:]
        if tail:
            self.kv_pool.free(tail)
            del mem.pages[keep:]
            mem.reserved_pages += len(tail)
            self.reserved_pages += len(tail)
        return len(tail)

    def token_slots(self, mem: ReqMemory, upto: int) -> torch.Tensor:
        """KV token slots of tokens [0, upto) as an int64 tensor (vectorised: contexts are long)."""
        ps = self.page_size
        # Through the page list's own mirror (page_list.py): ~2 us for 2000 pages instead of torch.tensor's ~100.
        pages = mem.pages.as_tensor(self.pages_for(upto))  # type: ignore[attr-defined]
        if ps == 1:
            return pages.clone()  # the mirror is shared: the caller may write to its tensor
        return (pages[:, None] * ps + torch.arange(ps)).flatten()[:upto]

    def checkpoint(self, mem: ReqMemory, tokens: list[int]) -> bool:
        """Cache the KV of tokens[:kv_len] and a copy of the state after them. False when no slot was free."""
        if not self.caching or mem.kv_len % self.page_size or mem.kv_len <= mem.tree_len:
            return False
        slot = self._alloc_slot()
        if slot is None:
            return False
        assert mem.slot is not None
        self.state_pool.copy(mem.slot, slot)
        used = self._insert(mem, tokens, slot)
        if not used:
            self.state_pool.free(slot)
        return used

    def take_checkpoint_slot(self) -> int | None:
        """A slot for a state the model writes during the next forward (None: caching off or none free)."""
        return self._alloc_slot() if self.caching else None

    def commit_checkpoint(self, mem: ReqMemory, tokens: list[int], n: int, slot: int) -> bool:
        """Cache the KV of tokens[:n] and the state in `slot` (written by the forward that computed token n-1).
        The slot is freed when the tree already has a state there; False then."""
        if not (mem.tree_len < n <= mem.kv_len and n % self.page_size == 0):
            self.state_pool.free(slot)
            return False
        used = self._insert(mem, tokens, slot, n)
        if not used:
            self.state_pool.free(slot)
        return used

    def commit_checkpoints(self, mem: ReqMemory, tokens: list[int], points: list[tuple[int, int]]) -> int:
        """`commit_checkpoint` for each (n, slot) of a prefill chunk's checkpoints, ascending n, in one nested
        insert (RadixCache.insert_nested); returns how many states the tree took."""
        valid: list[tuple[int, int]] = []
        for n, slot in points:
            if max(mem.tree_len, valid[-1][0] if valid else 0) < n <= mem.kv_len and n % self.page_size == 0:
                valid.append((n, slot))
            else:
                self.state_pool.free(slot)
        if len(valid) < 2:
            return sum(self.commit_checkpoint(mem, tokens, n, slot) for n, slot in valid)
        end = valid[-1][0]
        deepest, used = self.tree.insert_nested(tokens[:end], mem.pages[: end // self.page_size], valid)
        # Only the deepest insert can meet pages the tree already had: the others' pages are the tree's by then.
        self._adopt(mem, deepest, end)
        for took, (_, slot) in zip(used, valid, strict=True):
            if not took:
                self.state_pool.free(slot)
        return sum(used)

    def free_slot(self, slot: int) -> None:
        self.state_pool.free(slot)

    def _insert(self, mem: ReqMemory, tokens: list[int], slot: int | None, n: int | None = None) -> bool:
        n = mem.kv_len if n is None else n
        res = self.tree.insert(tokens[:n], mem.pages[: n // self.page_size], slot)
        self._adopt(mem, res, n)
        return res.state_used

    def _adopt(self, mem: ReqMemory, res: InsertResult, n: int) -> None:
        """The request's first n tokens now live in the tree at res.node: its pages become the tree's (the
        duplicates it computed again go back) and its lock moves down to that node."""
        self.kv_pool.free(res.duplicate_pages)
        mem.pages[: n // self.page_size] = res.pages
        self.tree.lock(res.node)
        if mem.node is not None:
            self.tree.unlock(mem.node)
        mem.node, mem.tree_len = res.node, n

    def release(self, mem: ReqMemory, tokens: list[int], cache: bool) -> None:
        """Give everything back; with `cache`, the sequence (KV and final state) goes into the cache."""
        if cache and self.caching and mem.kv_len % self.page_size == 0 and mem.kv_len > mem.tree_len:
            assert mem.slot is not None
            if self._insert(mem, tokens, mem.slot):
                mem.slot = None  # the final state now belongs to the cache: the request is done with it
        self.kv_pool.free(mem.pages[mem.tree_len // self.page_size :])
        mem.pages = mem.pages[: mem.tree_len // self.page_size]
        if mem.slot is not None:
            self.state_pool.free(mem.slot)
            mem.slot = None
        if mem.node is not None:
            self.tree.unlock(mem.node)
            mem.node = None
        self.reserved_pages -= mem.reserved_pages
        mem.reserved_pages = 0
        self.live.remove(mem)

    def flush(self) -> bool:
        if self.live:
            return False
        return self.tree.flush()

    # -- accounting ------------------------------------------------------------------------------------------

    def page_counts(self) -> tuple[int, int, int, int]:
        """(total, free, cached, in_use) KV pages."""
        in_use = sum(len(m.pages) - m.tree_len // self.page_size for m in self.live)
        return self.kv_pool.num_pages, self.kv_pool.num_free, self.tree.cached_pages, in_use

    def slot_counts(self) -> tuple[int, int, int, int]:
        """(total, free, cached, in_use) state slots."""
        in_use = sum(1 for m in self.live if m.slot is not None)
        return self.state_pool.num_slots, self.state_pool.num_free, self.tree.cached_states, in_use

    def check_invariants(self) -> None:
        """free + cached + in-use == total (pages and slots), with no page or slot in two places."""
        self.tree.check_invariants()
        ps = self.page_size
        total, free, cached, in_use = self.page_counts()
        assert free + cached + in_use == total, f"KV pages: {free}+{cached}+{in_use} != {total}"
        private = [p for m in self.live for p in m.pages[m.tree_len // ps :]]
        everything = self.kv_pool.free_pages() + self.tree.all_pages() + private
        assert sorted(everything) == list(range(total)), "a KV page is lost or in two places"
        total_s, free_s, cached_s, in_use_s = self.slot_counts()
        assert free_s + cached_s + in_use_s == total_s, f"slots: {free_s}+{cached_s}+{in_use_s} != {total_s}"
        own = [m.slot for m in self.live if m.slot is not None]
        slots = self.state_pool.free_slots() + self.tree.all_states() + own
        assert sorted(slots) == list(range(total_s)), "a state slot is lost or in two places"
        assert self.reserved_pages == sum(m.reserved_pages for m in self.live)
        assert self.reserved_pages <= free + self.tree.evictable_pages, "reservations exceed reclaimable"
        for m in self.live:
            assert m.tree_len <= m.kv_len and len(m.pages) == self.pages_for(m.kv_len)
            if m.node is not None:
                assert m.pages[: m.tree_len // ps] == self.tree.path_pages(m.node), "request/tree differ"


def _kv_too_small(total_tokens: int, pool: KVPagePool) -> str:
    return (
        f"KV cache pool allocation failed: the request needs {total_tokens} tokens (prompt + "
        f"max_new_tokens) but the KV pool holds {pool.num_pages * pool.page_size} tokens in total. "
        f"Shorten the request, lower max_new_tokens, or give the pools more memory (memory_budget_gib, "
        f"mem_fraction_static, or a lower mamba_full_memory_ratio)."
    )


def _state_too_small(pool: StateSlotPool) -> str:
    return (
        f"Mamba state pool allocation failed: a request needs 1 state slot but the pool has {pool.num_slots} "
        f"(max_mamba_cache_size={pool.num_slots}). Raise max_mamba_cache_size, mamba_full_memory_ratio or "
        f"memory_budget_gib."
    )
