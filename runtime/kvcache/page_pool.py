"""The paged KV pool's allocator: hands out pages of `page_size` token slots of the full-attention KV buffers.

Page p covers token slots [p * page_size, (p + 1) * page_size). The allocator only tracks which pages are
free; the prefix cache knows which are cached, and requests know which they hold privately.

Pages never handed out are not listed: they are the ones at or above a cursor (`_fresh`), so a pool of a
million pages costs a byte a page (`_state`), not a Python list of a million ints (~40 MB resident). Freed and
added pages go on a stack that is served first; the cursor serves the rest lowest first. That is the order a
list of every page, lowest on top, gave: reuse the most recently freed page, else the lowest never used, so the
memory a workload touches stays as small as it can (the buffers are untouched until written).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable

import torch

_TAKEN, _STACKED, _FRESH = 0, 1, 2  # in use or withdrawn; free on the stack; free and never handed out


class KVPagePool:
    def __init__(self, num_pages: int, page_size: int) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._state = bytearray([_FRESH]) * num_pages
        self._stack: list[int] = []  # free pages that were used (or added), the most recent last
        self._fresh = 0  # every _FRESH page is at or above this index
        self._num_free = num_pages
        self.handed_out = 0  # pages alloc() returned: the engine sizes its idle reserve from this
        self._faulted_below = 0  # fresh pages under this index were zeroed while idle (prefault)

    @property
    def num_free(self) -> int:
        return self._num_free

    def _is_free(self, page: int) -> bool:
        return self._state[page] != _TAKEN

    def alloc(self, n: int) -> list[int] | None:
        """n pages, or None (nothing taken) when fewer than n are free."""
        if n > self._num_free:
            return None
        take = min(n, len(self._stack))
        pages = [self._stack.pop() for _ in range(take)]
        state = self._state
        while len(pages) < n:
            page = state.find(_FRESH, self._fresh)  # withdrawn pages above the cursor are skipped
            pages.append(page)
            self._fresh = page + 1
        for p in pages:
            state[p] = _TAKEN
        self._num_free -= n
        self.handed_out += n
        return pages

    def free(self, pages: list[int]) -> None:
        state = self._state
        for p in pages:
            if state[p] != _TAKEN:
                raise RuntimeError(f"KV page {p} freed twice")
            state[p] = _STACKED
            self._stack.append(p)
        self._num_free += len(pages)

    def free_pages(self) -> list[int]:
        """Every free page, the next to be handed out last."""
        state = self._state
        fresh = [p for p in range(len(state) - 1, self._fresh - 1, -1) if state[p] == _FRESH]
        return fresh + self._stack

    def resize(self, capacity: int, owned: Iterable[int] | None = None) -> None:
        """Start over as a pool of page ids [0, capacity) that owns `owned` of them (all by default), all free;
        refused while any page is allocated (the elastic pool lays its chunks out at start-up)."""
        if self._num_free != self.num_pages:
            raise RuntimeError(f"KV pool resized with {self.num_pages - self._num_free} pages in use")
        mine = set(range(capacity) if owned is None else owned)
        if mine and not 0 <= min(mine) <= max(mine) < capacity:
            raise ValueError(f"KV pages {min(mine)}..{max(mine)} are outside a pool of {capacity} pages")
        # Pages the pool does not own are marked taken, so the cursor skips them; owned ones are fresh and
        # handed out lowest first, as a new pool.
        self._state = bytearray([_FRESH]) * capacity if owned is None else bytearray([_TAKEN]) * capacity
        if owned is not None:
            for p in mine:
                self._state[p] = _FRESH
        self._stack = []
        self._fresh = 0
        self._faulted_below = 0
        self._num_free = len(mine)
        self.num_pages = len(mine)

    def take(self, pages: Iterable[int]) -> None:
        """Take free pages out of the pool for good (the elastic pool gives their bytes to states).

        One pass over the stack for any number of pages: per page (or per chunk) it would be quadratic, and
        start-up hands thousands of chunks over at once.
        """
        gone = set(pages)
        state = self._state
        stacked = False
        for p in gone:
            if state[p] == _TAKEN:
                raise RuntimeError(f"KV page {p} taken out of the pool while in use")
            stacked = stacked or state[p] == _STACKED
            state[p] = _TAKEN
        if stacked:
            self._stack = [p for p in self._stack if p not in gone]
        self._num_free -= len(gone)
        self.num_pages -= len(gone)

    def give(self, pages: list[int]) -> None:
        """Give the pool pages it did not have (free; handed out next, `pages[0]` first)."""
        state = self._state
        for p in pages:
            if state[p] != _TAKEN:
                raise RuntimeError(f"KV page {p} given to the pool twice")
            state[p] = _STACKED
        self._stack.extend(reversed(pages))
        self._num_free += len(pages)
        self.num_pages += len(pages)

    def prefault(self, count: int, kv: list[torch.Tensor], stop: Callable[[], bool] | None = None) -> int:
        """Zero, in every `kv` buffer ([token slots, ...] per layer), the fresh pages among the next `count` the
        allocator hands out (the stack's pages come first and were written already), one page-run per buffer at
        a time, giving up as soon as `stop()` says so; returns how many pages are done. The buffers are allocated
        untouched, so a cold prompt's first KV write faulted them in on its path (real-size Nemotron-H, 2048
        tokens: 8k faults). Free never-handed-out pages only: no state is touched, the order is kept."""
        state = self._state
        end = min(len(state), self._fresh + max(0, count - len(self._stack)))
        row_bytes = max((t[0].numel() * t.element_size() for t in kv), default=1)
        run = max(1, (1 << 20) // (self.page_size * row_bytes))  # ~1 MB per memset: stop() is asked often
        done = 0
        page = max(self._fresh, self._faulted_below)
        while page < end:
            last = page
            while last < end and last - page < run and state[last] == _FRESH:  # never a page someone has
                last += 1
            rows = slice(page * self.page_size, last * self.page_size)
            for t in kv:
                if stop is not None and stop():
                    return done
                zero_releasing_the_gil(t[rows])
            done += last - page
            page = last if last > page else page + 1
            self._faulted_below = page
        return done


def zero_releasing_the_gil(t: torch.Tensor) -> None:
    """t.zero_(), but for a contiguous CPU tensor through ctypes' memset, which lets go of the GIL (torch's zero_
    keeps it): the event loop then parses a request that arrives meanwhile instead of waiting for the page faults."""
    if t.device.type == "cpu" and t.is_contiguous():
        ctypes.memset(t.data_ptr(), 0, t.numel() * t.element_size())
    else:
        t.zero_()
