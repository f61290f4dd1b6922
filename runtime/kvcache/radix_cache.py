"""State-aware radix prefix cache over token ids, with two LRU lists (KV leaves, states).

Each node holds the KV pages of its tokens; some nodes also hold a state slot: the recurrent state after the
node's last token. A prefix is only reusable up to the deepest node that has a state, because the KV after it
cannot be continued without the state there. Cached states are never handed out for writing: a request gets a
COPY (`snapshot`), so one cached state serves any number of later requests.

Locks: a request locks the node its cached prefix ends at; the lock counts on every ancestor, and locked
nodes' KV is never evicted. States are always evictable (requests run on copies); on a locked node only the
state is dropped, never the KV. Keys are at page granularity: every node's length is a multiple of page_size.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from dataclasses import dataclass, field

from runtime.kvcache.common_prefix import common_prefix_len
from runtime.kvcache.page_pool import KVPagePool
from runtime.kvcache.state_pool import StateSlotPool


class RadixNode:
    __slots__ = ("key", "pages", "state_slot", "children", "parent", "lock_ref", "kv_access", "state_access")

    def __init__(self, key: tuple[int, ...], pages: list[int], parent: RadixNode | None) -> None:
        self.key = key
        self.pages = pages
        self.state_slot: int | None = None
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.kv_access = 0
        self.state_access = 0

    @property
    def is_leaf(self) -> bool:
        return not self.children


@dataclass
class PrefixMatch:
    node: RadixNode  # deepest matched node with a state (root when nothing usable matched)
    length: int  # tokens covered, a multiple of page_size
    pages: list[int] = field(default_factory=list)  # the KV pages of those tokens, in order
    state_slot: int | None = None  # the cached state after `length` tokens (None for the root)
    # Tokens whose KV the tree holds (whole pages), state or not: beyond `length`, the prefix is cached KV
    # without a state. A request that computes that far can checkpoint the state there (the branch point).
    kv_length: int = 0


@dataclass
class InsertResult:
    node: RadixNode  # the node ending exactly at the inserted length
    pages: list[int]  # the tree's pages for the whole inserted prefix (adopt these)
    duplicate_pages: list[int]  # caller's pages the tree already had under other page ids: caller frees them
    state_used: bool  # False: the node already had a state (or none was given); the caller keeps its slot


class RadixCache:
    def __init__(
        self, kv_pool: KVPagePool, state_pool: StateSlotPool, *, page_size: int, dual_lru: bool = True
    ) -> None:
        self.kv_pool = kv_pool
        self.state_pool = state_pool
        self.page_size = page_size
        self.dual_lru = dual_lru
        self._clock = itertools.count(1)
        self.root = RadixNode((), [], None)
        self.root.lock_ref = 1  # the root is never evicted
        self.cached_pages = 0
        self.cached_states = 0
        self.locked_pages = 0
        self.kv_evicted_pages = 0
        self.states_evicted = 0

    # -- lookup / insert -------------------------------------------------------------------------------------

    def _child_key(self, tokens: list[int] | tuple[int, ...], pos: int) -> tuple[int, ...]:
        return tuple(tokens[pos : pos + self.page_size])

    def _common_len(self, key: tuple[int, ...], tokens: list[int], pos: int) -> int:
        """Tokens of `key` matching tokens[pos:], rounded down to whole pages."""
        n = common_prefix_len(key, tuple(tokens[pos : pos + len(key)]))
        return n - n % self.page_size

    def match_prefix(self, tokens: list[int]) -> PrefixMatch:
        """The longest cached prefix of `tokens` that ends at a state. Touches both LRU lists."""
        node, pos = self.root, 0
        best, best_pos = self.root, 0
        path: list[RadixNode] = []
        kv_end = 0
        while pos + self.page_size <= len(tokens):
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            common = self._common_len(child.key, tokens, pos)
            if common < len(child.key):
                kv_end = pos + common
                break
            pos += len(child.key)
            node = child
            path.append(node)
            if node.state_slot is not None:
                best, best_pos = node, pos
        kv_end = max(kv_end, pos)
        if best is self.root:
            return PrefixMatch(self.root, 0, kv_length=kv_end)
        now = next(self._clock)
        pages: list[int] = []
        for n in path:
            n.kv_access = now
            pages.extend(n.pages)
            if n is best:
                break
        best.state_access = now
        return PrefixMatch(best, best_pos, pages, best.state_slot, kv_length=kv_end)

    def insert(self, tokens: list[int], pages: list[int], state_slot: int | None) -> InsertResult:
        """Cache tokens (whole pages) with their KV pages and, optionally, the state after them.

        Ownership of `pages` not already in the tree passes to the tree; `duplicate_pages` are the caller's to
        free. When `state_used`, the slot now belongs to the tree.
        """
        ps = self.page_size
        if len(tokens) % ps or len(pages) != len(tokens) // ps:
            raise ValueError(f"insert needs whole pages: {len(tokens)} tokens, {len(pages)} pages, page {ps}")
        now = next(self._clock)
        node, pos = self.root, 0
        tree_pages: list[int] = []
        dups: list[int] = []
        while pos < len(tokens):
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                new = RadixNode(tuple(tokens[pos:]), list(pages[pos // ps :]), node)
                new.kv_access = now
                node.children[new.key[:ps]] = new
                self.cached_pages += len(new.pages)
                tree_pages.extend(new.pages)
                node, pos = new, len(tokens)
                break
            common = self._common_len(child.key, tokens, pos)
            if common < len(child.key):
                child = self._split(child, common)
            child.kv_access = now
            mine = pages[pos // ps : (pos + common) // ps]
            if mine != child.pages:  # mostly equal (a request re-inserting the pages it got from the tree)
                dups.extend(p for p, t in zip(mine, child.pages, strict=True) if p != t)
            tree_pages.extend(child.pages)
            node, pos = child, pos + common
        used = False
        if state_slot is not None and node is not self.root and node.state_slot is None:
            node.state_slot = state_slot
            node.state_access = now
            self.cached_states += 1
            used = True
        return InsertResult(node, tree_pages, dups, used)

    def insert_nested(
        self, tokens: list[int], pages: list[int], points: list[tuple[int, int]]
    ) -> tuple[InsertResult, list[bool]]:
        """`insert(tokens[:n], pages[:n // page_size], slot)` for each (n, slot) of `points` (ascending n, whole
        pages, the last n == len(tokens)), leaving the tree and its access stamps as those inserts in that order
        would. Returns the last insert's result and, per point, whether the tree took its slot.

        Why: a prefill chunk's checkpoints (one every 64 tokens) inserted one by one each walk down from the root
        and compare their tokens with every node the ones before made: ~1.2 ms of Python for a cold 2048-token
        prompt, on the way to its first token. Here the whole prompt is inserted once and the nodes on its path
        are cut at the other points: they are its prefixes, so there is nothing more to compare."""
        last = self.insert(tokens, pages, points[-1][1])
        path: list[RadixNode] = []  # root's child first, last.node last
        node: RadixNode | None = last.node
        while node is not None and node is not self.root:
            path.append(node)
            node = node.parent
        path.reverse()
        ends = list(itertools.accumulate(len(n.key) for n in path))
        used = [last.state_used]
        for n, slot in reversed(points[:-1]):
            i = bisect.bisect_left(ends, n)
            node = path[i]
            if ends[i] != n:  # inside the node: cut it there (the lower part keeps any state)
                node = self._split(node, n - (ends[i] - len(node.key)))
                path.insert(i, node)
                ends.insert(i, n)
            took = node.state_slot is None
            if took:
                node.state_slot = slot
                self.cached_states += 1
            used.append(took)
        used.reverse()
        # The stamps of inserts made shallowest first: each state in order, every node on the path the last's.
        now = 0
        for (n, _), took in zip(points, used, strict=True):
            now = next(self._clock)
            if took:
                path[bisect.bisect_left(ends, n)].state_access = now
        for node in path:
            node.kv_access = now
        return last, used

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut `node` after `at` tokens; returns the new upper part. The state stays on the lower part."""
        ps = self.page_size
        parent = node.parent
        assert parent is not None and 0 < at < len(node.key)
        upper = RadixNode(node.key[:at], node.pages[: at // ps], parent)
        upper.lock_ref = node.lock_ref
        upper.kv_access = node.kv_access
        upper.children[node.key[at : at + ps]] = node
        parent.children[node.key[:ps]] = upper
        node.key = node.key[at:]
        node.pages = node.pages[at // ps :]
        node.parent = upper
        return upper

    # -- locks -----------------------------------------------------------------------------------------------

    def lock(self, node: RadixNode) -> None:
        n: RadixNode | None = node
        while n is not None and n is not self.root:
            if n.lock_ref == 0:
                self.locked_pages += len(n.pages)
            n.lock_ref += 1
            n = n.parent

    def unlock(self, node: RadixNode) -> None:
        n: RadixNode | None = node
        while n is not None and n is not self.root:
            if n.lock_ref <= 0:
                raise RuntimeError("radix node unlocked more often than locked")
            n.lock_ref -= 1
            if n.lock_ref == 0:
                self.locked_pages -= len(n.pages)
            n = n.parent

    # -- eviction --------------------------------------------------------------------------------------------

    @property
    def evictable_pages(self) -> int:
        return self.cached_pages - self.locked_pages

    @property
    def evictable_states(self) -> int:
        """States `evict_states` can free: all of them with dual LRU; else only those on unlocked nodes,
        because a single LRU frees states only by evicting their KV."""
        if self.dual_lru:
            return self.cached_states
        return sum(1 for n in self._iter_nodes() if n.state_slot is not None and n.lock_ref == 0)

    def _iter_nodes(self) -> list[RadixNode]:
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def _drop_state(self, node: RadixNode) -> None:
        assert node.state_slot is not None
        self.state_pool.free(node.state_slot)
        node.state_slot = None
        self.cached_states -= 1
        self.states_evicted += 1

    def _remove_leaf(self, node: RadixNode) -> int:
        """Free a leaf's KV (and its state, which is useless without it). Returns pages freed."""
        assert node.is_leaf and node.lock_ref == 0 and node.parent is not None
        if node.state_slot is not None:
            self._drop_state(node)
        self.kv_pool.free(node.pages)
        self.cached_pages -= len(node.pages)
        self.kv_evicted_pages += len(node.pages)
        del node.parent.children[node.key[: self.page_size]]
        return len(node.pages)

    def evict_kv(self, num_pages: int, keep: RadixNode | None = None) -> int:
        """Free >= num_pages KV pages from unlocked leaves, least recently used first. Returns pages freed."""
        heap = [
            (n.kv_access, id(n), n)
            for n in self._iter_nodes()
            if n.is_leaf and n.lock_ref == 0 and n.parent and n is not keep
        ]
        heapq.heapify(heap)
        freed = 0
        while freed < num_pages and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            freed += self._remove_leaf(node)
            if parent is not self.root and parent is not None and parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.kv_access, id(parent), parent))
        return freed

    def detach_state(self, node: RadixNode) -> int:
        """Take a node's state out of the cache (the caller now owns the slot)."""
        slot = node.state_slot
        assert slot is not None
        node.state_slot = None
        self.cached_states -= 1
        return slot

    def path_pages(self, node: RadixNode) -> list[int]:
        chain: list[RadixNode] = []
        n: RadixNode | None = node
        while n is not None and n is not self.root:
            chain.append(n)
            n = n.parent
        return [p for n in reversed(chain) for p in n.pages]

    def evict_states(self, num_slots: int, keep: RadixNode | None = None) -> int:
        """Free at least num_slots cached states. Returns slots freed.

        Dual LRU: the least recently used states go first, whatever their KV; an unlocked leaf goes with its
        KV (KV past the last state is not reusable). Single LRU: only by evicting KV leaves, oldest first.
        """
        if not self.dual_lru:
            before = self.cached_states
            while self.cached_states > before - num_slots and self.evictable_pages > 0:
                if self.evict_kv(1, keep=keep) == 0:
                    break
            return before - self.cached_states
        candidates = sorted(
            (n for n in self._iter_nodes() if n.state_slot is not None and n is not keep),
            key=lambda n: n.state_access,
        )
        freed = 0
        for node in candidates[:num_slots]:
            if node.is_leaf and node.lock_ref == 0:
                self._remove_leaf(node)
            else:
                self._drop_state(node)
            freed += 1
        return freed

    def flush(self) -> bool:
        """Drop everything cached. Refused (False) while any node is locked."""
        if self.locked_pages or any(n.lock_ref for n in self.root.children.values()):
            return False
        for n in self._iter_nodes():
            if n is self.root:
                continue
            if n.state_slot is not None:
                self.state_pool.free(n.state_slot)
            self.kv_pool.free(n.pages)
        self.root.children.clear()
        self.cached_pages = self.cached_states = 0
        return True

    # -- accounting ------------------------------------------------------------------------------------------

    def all_pages(self) -> list[int]:
        return [p for n in self._iter_nodes() for p in n.pages]

    def all_states(self) -> list[int]:
        return [n.state_slot for n in self._iter_nodes() if n.state_slot is not None]

    def check_invariants(self) -> None:
        nodes = self._iter_nodes()
        pages = [p for n in nodes for p in n.pages]
        states = [n.state_slot for n in nodes if n.state_slot is not None]
        assert len(pages) == self.cached_pages, (len(pages), self.cached_pages)
        assert len(set(pages)) == len(pages), "a KV page is cached twice"
        assert len(states) == self.cached_states and len(set(states)) == len(states)
        locked = 0
        for n in nodes:
            if n is self.root:
                continue
            assert len(n.key) == len(n.pages) * self.page_size and n.key
            assert n.parent is not None and n.parent.children[n.key[: self.page_size]] is n
            child_locks = sum(c.lock_ref for c in n.children.values())
            assert n.lock_ref >= child_locks, "a child is locked more than its parent"
            if n.lock_ref:
                locked += len(n.pages)
        assert locked == self.locked_pages, (locked, self.locked_pages)
