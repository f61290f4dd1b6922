"""A request's KV page list that keeps an int64 tensor copy of itself up to date incrementally.

A decode step gathers every token of every running sequence from the KV pool through an int64 index. Built from
the page list each step (`torch.tensor(pages[:kv_len] + [new])`), that is O(context) Python work per token: at
4000 tokens ~5 ms of a loaded 2-core host's step, ~40x the incremental update. So the list mirrors itself into
a tensor: decode appends write one element; anything that changes existing entries (the prefix cache swapping
in its own pages for duplicates, a spec-decode rollback, a reassignment) lowers `_valid`, the count of leading
entries known to be mirrored, and the next read re-copies from there into a fresh buffer (a tensor handed out
earlier is never written below the length it was handed out with).
"""

from __future__ import annotations

import operator
from typing import Any, SupportsIndex

import numpy as np
import torch

from runtime.kvcache.common_prefix import common_prefix_len


class PageList(list[int]):
    """list[int] of page ids, plus `as_tensor(n)`: its first n entries as int64 (a view of a growing buffer)."""

    __slots__ = ("_buf", "_valid")

    def __init__(self, pages: Any = ()) -> None:
        super().__init__(pages)
        # The mirror, written and sliced through NumPy: a decode step's one-element write and the view handed out
        # cost ~2 us together instead of ~18 through torch (a torch.tensor of the new entries, a slice assignment,
        # a slice), per running sequence per step. Views go out as torch tensors sharing its memory.
        self._buf: np.ndarray | None = None
        self._valid = 0  # leading entries equal in the list and in _buf

    def as_tensor(self, n: int) -> torch.Tensor:
        """The first `n` entries as an int64 tensor (a view: do not write to it)."""
        buf = self._buf
        if buf is None or buf.size < n:
            fresh = np.empty(max(64, 2 * n), dtype=np.int64)
            if buf is not None and self._valid:
                fresh[: self._valid] = buf[: self._valid]
            self._buf = buf = fresh
        valid = self._valid
        if valid + 1 == n:  # the decode step: one new entry
            buf[valid] = list.__getitem__(self, valid)
            self._valid = n
        elif valid < n:
            buf[valid:n] = list.__getitem__(self, slice(valid, n))
            self._valid = n
        return torch.from_numpy(buf[:n])

    def _changed_from(self, index: int) -> None:
        """Entries from `index` on may differ from the buffer: they are re-copied, into a fresh buffer (so views
        handed out before keep what they showed), when next read."""
        if self._buf is None or index >= self._valid:
            return
        fresh = np.empty(self._buf.size, dtype=np.int64)
        if index:
            fresh[:index] = self._buf[:index]
        self._buf, self._valid = fresh, index

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, slice) and index.step in (None, 1):
            start, stop, _ = index.indices(len(self))
            new = list(value)
            old = list.__getitem__(self, slice(start, stop))
            if old != new:  # the prefix cache hands back the pages it already had, mostly: no change then
                self._changed_from(start + common_prefix_len(old, new))
            super().__setitem__(index, new)
            return
        position = 0 if isinstance(index, slice) else operator.index(index)
        self._changed_from(max(0, position))  # a negative index: conservatively everything
        super().__setitem__(index, value)

    def __delitem__(self, index: Any) -> None:
        if isinstance(index, slice) and index.step in (None, 1):
            self._changed_from(index.indices(len(self))[0])  # entries before the cut stay where they are
        else:
            self._changed_from(0)
        super().__delitem__(index)

    # Anything else that moves or replaces existing entries: start over (appends and extends do not).
    def insert(self, index: SupportsIndex, value: int) -> None:
        self._changed_from(0)
        super().insert(index, value)

    def pop(self, index: SupportsIndex = -1) -> int:
        self._changed_from(0)
        return super().pop(index)

    def remove(self, value: int) -> None:
        self._changed_from(0)
        super().remove(value)

    def clear(self) -> None:
        self._changed_from(0)
        super().clear()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self._changed_from(0)
        super().sort(*args, **kwargs)

    def reverse(self) -> None:
        self._changed_from(0)
        super().reverse()

    def __imul__(self, n: SupportsIndex) -> PageList:
        self._changed_from(0)
        return super().__imul__(n)
