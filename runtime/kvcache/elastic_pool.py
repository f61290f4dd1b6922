"""The elastic memory pool: one buffer whose chunks move between the KV pool and the state pool at run time.

The buffer is `num_chunks` chunks of `rows_per_chunk` rows; a row holds one token's K and V of every
full-attention layer, and a chunk holds one state slot (conv + SSM of every linear layer) in the same bytes.
So chunk c is either KV pages [c * ppc, (c + 1) * ppc) or state slot c, and the model's per-layer tensors are
strided views of that one buffer that cover it twice (KV view and state view): which one owns a chunk is the
allocators' business. A chunk moves only when nothing in it is in use (its pages all free, or its slot free);
cached entries are evicted from one side to grow the other. This is SGLang's `--enable-unified-memory`
re-done on one preallocated buffer (the CPU path); on CUDA with VMM the same chunks could be mapped and
unmapped instead (runtime/kvcache/cuda_vmm.py probes for it).

A move that cannot happen (every candidate chunk holds in-use or promised memory) is retried at every step
until `elastic_realloc_timeout_s`; then it is abandoned with "Elastic memory pool reallocation timeout" and
its cause, and the engine goes on serving with the split it has.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from runtime.core.batch import ModelLayout, PoolBuffers
from runtime.core.requests import EngineStats
from runtime.kvcache.cache_manager import CacheManager
from runtime.kvcache.elastic_buffer import ElasticGeometry, allocate_elastic_buffers, elastic_geometry

logger = logging.getLogger("runtime.kvcache")

TIMEOUT_MESSAGE = "Elastic memory pool reallocation timeout"
_HISTORY = 512


class Queued(Protocol):
    """What the pool reads of a waiting request (the scheduler's Req) to size the memory it will need."""

    prompt_ids: list[int]
    max_new_tokens: int


@dataclass
class _Pending:
    direction: str  # "kv" (state chunks -> KV) or "state" (KV chunks -> state)
    since: float
    cause: str = ""


@dataclass
class ElasticCounters:
    moves_to_kv: int = 0
    moves_to_state: int = 0
    timeouts: int = 0
    history: deque[tuple[float, int, int]] = field(default_factory=lambda: deque(maxlen=_HISTORY))

    @property
    def moves(self) -> int:
        return self.moves_to_kv + self.moves_to_state


class ElasticPool:
    """Owns which chunk is KV and which is state; moves chunks with the pools' own free lists."""

    def __init__(self, geo: ElasticGeometry, backing: torch.Tensor, timeout_s: float, mode: str) -> None:
        self.geo = geo
        self.backing = backing
        self.timeout_s = timeout_s
        self.mode = mode
        self.is_state = [False] * geo.num_chunks
        self.counters = ElasticCounters()
        self._pending: _Pending | None = None
        self.slots_per_request = 1  # the planner's state slots per running request (attach sets it)
        self.user_cap = geo.num_chunks  # --max-running-requests, when given
        self.running_cap = 0
        self._cache: CacheManager | None = None

    @property
    def cache(self) -> CacheManager:
        assert self._cache is not None, "the elastic pool is not attached to a cache yet"
        return self._cache

    @cache.setter
    def cache(self, cache: CacheManager) -> None:
        self._cache = cache

    # -- set-up ----------------------------------------------------------------------------------------------

    def attach(
        self,
        cache: CacheManager,
        initial_state_chunks: int,
        *,
        slots_per_request: int = 1,
        user_cap: int | None = None,
    ) -> None:
        """Lay `cache`'s two pools out over the chunks: the top `initial_state_chunks` hold states (pages are
        taken lowest first, so the top chunks are the ones most often free later, too), the rest KV pages.
        The running cap is the planner's K // `slots_per_request`, within `user_cap` (--max-running-requests)."""
        geo = self.geo
        k = min(max(1, initial_state_chunks), geo.num_chunks - 1)
        state_chunks = set(range(geo.num_chunks - k, geo.num_chunks))
        kv_pages = (p for c in range(geo.num_chunks) if c not in state_chunks for p in geo.chunk_pages(c))
        cache.kv_pool.resize(geo.num_chunks * geo.pages_per_chunk, kv_pages)  # one pass: linear in the pool
        cache.state_pool.resize(geo.num_chunks, state_chunks)
        for chunk in state_chunks:
            self.is_state[chunk] = True
        self.cache = cache
        self.slots_per_request = slots_per_request
        self.user_cap = user_cap or geo.num_chunks
        self._record()

    # -- the two moves ---------------------------------------------------------------------------------------

    def _to_state(self, chunk: int) -> None:
        self.cache.kv_pool.take(self.geo.chunk_pages(chunk))
        self.cache.state_pool.give(chunk)
        self.is_state[chunk] = True
        self.counters.moves_to_state += 1

    def _to_kv(self, chunk: int) -> None:
        self.cache.state_pool.take(chunk)
        self.cache.kv_pool.give(list(self.geo.chunk_pages(chunk)))
        self.is_state[chunk] = False
        self.counters.moves_to_kv += 1

    def _free_kv_chunk(self) -> int | None:
        """A KV chunk whose pages are all free (highest first), or None."""
        ppc = self.geo.pages_per_chunk
        free_count: dict[int, int] = {}
        for p in self.cache.kv_pool.free_pages():
            c = p // ppc
            free_count[c] = free_count.get(c, 0) + 1
        full = [c for c, n in free_count.items() if n == ppc and not self.is_state[c]]
        return max(full) if full else None

    def grow_state(self, keep_pages: int = 0) -> str | None:
        """Move one KV chunk to the state pool, keeping `keep_pages` available. None: done, else why not."""
        cache = self.cache
        ppc = self.geo.pages_per_chunk
        if cache.available_pages - ppc < keep_pages:
            held = cache.kv_pool.num_pages - cache.available_pages
            return (
                f"pages pinned by running requests: {held} of {cache.kv_pool.num_pages} KV pages are in use "
                f"or promised, a move needs {ppc + keep_pages} available"
            )
        chunk = self._free_kv_chunk()
        if chunk is None and cache.tree.evictable_pages:
            cache.tree.evict_kv(min(cache.tree.evictable_pages, ppc * 4))
            chunk = self._free_kv_chunk()
        if chunk is None:
            return (f"pages pinned by running requests: every KV chunk of {ppc} pages holds a page in use "
                    f"({cache.kv_pool.num_free} pages free but scattered)")  # fmt: skip
        self._to_state(chunk)
        return None

    def grow_kv(self) -> str | None:
        """Move one state chunk to the KV pool. None when done, else why not (nothing changed)."""
        cache = self.cache
        st = cache.state_pool
        if not st.num_free and cache.tree.evictable_states:
            cache.tree.evict_states(1)
        if not st.num_free:
            return f"state slots pinned by running requests: all {st.num_slots} slots are in use"
        self._to_kv(max(st.free_slots()))
        return None

    # -- policy (engine thread, before each step) -----------------------------------------------------------

    def _running_cap(self) -> int:
        """The planner's rule on the current split: K // slots_per_request, within the user's cap."""
        self.running_cap = max(1, min(self.user_cap, self.cache.state_pool.num_slots // self.slots_per_request))
        return self.running_cap

    def _demand(self, waiting: Sequence[Queued], running: int, cap: int) -> tuple[str, int, int] | None:
        """(direction, chunks, head's pages) when the queue's head waits for memory the other pool has."""
        if not waiting:
            return None
        cache, spr = self.cache, self.slots_per_request
        slots = cache.state_pool.num_slots
        head = waiting[0]
        need = cache.pages_for(len(head.prompt_ids) + head.max_new_tokens - 1)
        if running >= cap:  # the queue waits on the running cap: more slots raise it
            return ("state", max(1, (running + 1) * spr - slots), need) if cap < self.user_cap else None
        spare = min(slots - (running + 1) * spr, cache.available_slots - 1)
        if need > cache.available_pages and spare > 0:
            return "kv", min(spare, -(-(need - cache.available_pages) // self.geo.pages_per_chunk)), need
        if cache.available_slots < 1:
            return "state", 1, need
        return None

    def rebalance(self, waiting: Sequence[Queued], running: int) -> int:
        """Move chunks toward the pool the queue's head waits on; returns the running-request cap for the split
        as it was when the step began (the scheduler admits up to it)."""
        cap = self._running_cap()
        self._move_for(self._demand(waiting, running, cap), waiting, running)
        return cap

    def _move_for(self, demand: tuple[str, int, int] | None, waiting: Sequence[Queued], running: int) -> None:
        now = time.monotonic()
        if demand is None:
            self._pending = None
            return
        direction, chunks, need = demand
        if self._pending is None or self._pending.direction != direction:
            self._pending = _Pending(direction, now)
        moved = 0
        for _ in range(chunks):
            cause = self.grow_kv() if direction == "kv" else self.grow_state(keep_pages=need)
            if cause is not None:
                self._pending.cause = cause
                break
            moved += 1
        if moved == chunks and direction == "state":
            self._grow_state_for_queue(waiting, running)
        if moved:
            self._record()
            self._pending = None if moved == chunks else _Pending(direction, now)
            return
        if now - self._pending.since > self.timeout_s:
            self.counters.timeouts += 1
            target = "KV pool" if direction == "kv" else "state pool"
            logger.error(
                "%s: could not grow the %s within elastic_realloc_timeout_s=%gs; cause: %s. Serving "
                "on with the current split (%d KV tokens, %d state slots). Fix: raise "
                "memory.elastic_realloc_timeout_s, or size the pools for the workload "
                "(memory.mamba_full_memory_ratio) and set memory.enable_elastic_memory_pool = false.",
                TIMEOUT_MESSAGE, target, self.timeout_s, self._pending.cause,
                self.cache.kv_pool.num_pages * self.geo.page_size, self.cache.state_pool.num_slots,
            )  # fmt: skip
            self._pending = None
            # The queue head keeps waiting on this split; the next attempt starts a fresh deadline.

    def _grow_state_for_queue(self, waiting: Sequence[Queued], running: int) -> None:
        """Best effort past the head: slots for more of the queue, as long as the KV they need stays free."""
        cache, spr = self.cache, self.slots_per_request
        wanted = min(len(waiting), self.user_cap - running)
        keep = 0
        for i, req in enumerate(waiting[:wanted]):
            keep += cache.pages_for(len(req.prompt_ids) + req.max_new_tokens - 1)
            while cache.state_pool.num_slots < (running + i + 1) * spr:
                if self.grow_state(keep_pages=keep) is not None:
                    return

    # -- observability ---------------------------------------------------------------------------------------

    def _record(self) -> None:
        c = self.cache
        kv_tokens = c.kv_pool.num_pages * self.geo.page_size
        self.counters.history.append((time.time(), kv_tokens, c.state_pool.num_slots))

    def check_invariants(self) -> None:
        """Every chunk is KV or state; the pools' capacities and free lists stay inside their own chunks."""
        c = self.cache
        kv_chunks = [i for i, s in enumerate(self.is_state) if not s]
        state_chunks = [i for i, s in enumerate(self.is_state) if s]
        assert c.kv_pool.num_pages == len(kv_chunks) * self.geo.pages_per_chunk
        assert c.state_pool.num_slots == len(state_chunks)
        owned_pages = {p for ch in kv_chunks for p in self.geo.chunk_pages(ch)}
        ps = self.geo.page_size
        private = [p for m in c.live for p in m.pages[m.tree_len // ps :]]
        pages = c.kv_pool.free_pages() + c.tree.all_pages() + private
        assert sorted(pages) == sorted(owned_pages), "a KV page is lost, in two places, or in a state chunk"
        own = [m.slot for m in c.live if m.slot is not None]
        slots = c.state_pool.free_slots() + c.tree.all_states() + own
        assert sorted(slots) == state_chunks, "a state slot is lost, in two places, or in a KV chunk"
        assert c.reserved_pages <= c.kv_pool.num_free + c.tree.evictable_pages

    def fill_stats(self, stats: EngineStats) -> None:
        """The current split in the engine's stats (what /metrics and /server_info report)."""
        c, geo = self.cache, self.geo
        b = c.state_pool.buffers
        assert b is not None
        slots = c.state_pool.num_slots
        stats.max_total_num_tokens = c.kv_pool.num_pages * geo.page_size
        stats.max_mamba_cache_size = slots
        stats.kv_cache_bytes = stats.max_total_num_tokens * geo.row_bytes
        stats.conv_state_bytes = slots * sum(t[0].numel() * t.element_size() for t in b.conv)
        stats.ssm_state_bytes = slots * sum(t[0].numel() * t.element_size() for t in b.ssm)
        stats.max_running_requests = self.running_cap or stats.max_running_requests
        stats.elastic_mode = self.mode
        stats.elastic_moves_total = self.counters.moves
        stats.elastic_realloc_timeouts_total = self.counters.timeouts

    def describe(self) -> str:
        geo = self.geo
        return (
            f"Elastic memory pool: mode={self.mode}, one buffer of "
            f"{geo.num_chunks * geo.chunk_bytes / (1 << 30):.3f} GB in {geo.num_chunks} chunks "
            f"(1 chunk = 1 state slot = {geo.rows_per_chunk} KV tokens), "
            f"start split: {self.cache.kv_pool.num_pages * geo.page_size} KV tokens, "
            f"{self.cache.state_pool.num_slots} state slots, realloc timeout {self.timeout_s:g}s"
        )


def make_elastic(
    fixed: PoolBuffers, pool_bytes: int, layout: ModelLayout, page_size: int, device: str, timeout_s: float
) -> tuple[ElasticPool, PoolBuffers]:
    """An elastic pool over `pool_bytes` (the fixed split's KV + state bytes, as the plan sized them) at the
    dtypes of the fixed split's tensors, and the model's per-layer views of its one buffer, which replace them.

    The engine allocates the fixed split on "meta" when the elastic pool is on, so the bytes are zeroed once."""
    kv_dtype = fixed.k[0].dtype if fixed.k else torch.float32
    conv_dtype = fixed.conv[0].dtype if fixed.conv else torch.float32
    ssm_dtype = fixed.ssm[0].dtype if fixed.ssm else torch.float32
    geo = elastic_geometry(layout, pool_bytes, page_size, kv_dtype, conv_dtype, ssm_dtype)
    mode = "cpu-repartition"
    if str(device).startswith("cuda"):
        from runtime.kvcache.cuda_vmm import vmm_status

        mode = f"cuda-repartition (one preallocated buffer; CUDA VMM: {vmm_status()})"
    backing, buffers = allocate_elastic_buffers(layout, geo, kv_dtype, conv_dtype, ssm_dtype, device)
    return ElasticPool(geo, backing, timeout_s, mode), buffers
