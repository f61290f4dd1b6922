"""The paged KV pool's allocator: hands out pages of `page_size` token slots of the full-attention KV buffers.

Page p covers token slots [p * page_size, (p + 1) * page_size). The allocator only tracks which pages are
free; the prefix cache knows which are cached, and requests know which they hold privately.
"""

from __future__ import annotations

from collections.abc import Iterable


class KVPagePool:
    def __init__(self, num_pages: int, page_size: int) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        # Lowest pages first: keeps early allocations contiguous, which makes dumps readable.
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._is_free = [True] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        """n pages, or None (nothing taken) when fewer than n are free."""
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._is_free[p] = False
        return pages

    def free(self, pages: list[int]) -> None:
        for p in pages:
            if self._is_free[p]:
                raise RuntimeError(f"KV page {p} freed twice")
            self._is_free[p] = True
            self._free.append(p)

    def free_pages(self) -> list[int]:
        return list(self._free)

    def resize(self, capacity: int, owned: Iterable[int] | None = None) -> None:
        """Start over as a pool of page ids [0, capacity) that owns `owned` of them (all by default), all free;
        refused while any page is allocated (the elastic pool lays its chunks out at start-up)."""
        if len(self._free) != self.num_pages:
            raise RuntimeError(f"KV pool resized with {self.num_pages - len(self._free)} pages in use")
        mine = sorted(set(range(capacity) if owned is None else owned), reverse=True)
        if mine and not 0 <= mine[-1] <= mine[0] < capacity:
            raise ValueError(f"KV pages {mine[-1]}..{mine[0]} are outside a pool of {capacity} pages")
        self._is_free = [False] * capacity
        for p in mine:
            self._is_free[p] = True
        self._free = mine  # lowest pages first, as a new pool
        self.num_pages = len(mine)

    def take(self, pages: Iterable[int]) -> None:
        """Take free pages out of the pool for good (the elastic pool gives their bytes to states).

        One pass over the free list for any number of pages: per page (or per chunk) it would be quadratic.
        """
        gone = set(pages)
        for p in gone:
            if not self._is_free[p]:
                raise RuntimeError(f"KV page {p} taken out of the pool while in use")
            self._is_free[p] = False
        self._free = [p for p in self._free if p not in gone]
        self.num_pages -= len(gone)

    def give(self, pages: list[int]) -> None:
        """Give the pool pages it did not have (free, taken after the ones already free)."""
        for p in pages:
            if self._is_free[p]:
                raise RuntimeError(f"KV page {p} given to the pool twice")
            self._is_free[p] = True
        self._free.extend(reversed(pages))
        self.num_pages += len(pages)
