"""The recurrent-state slot pool: one slot = conv window + SSM state of every linear layer for one sequence.

The allocator tracks free slots; `copy` and `zero` act on the real buffers (all linear layers at once), which
is how the prefix cache snapshots a running request's state and hands a cached state to a new request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from runtime.core.batch import PoolBuffers
from runtime.kvcache.page_pool import zero_releasing_the_gil


class StateSlotPool:
    def __init__(self, num_slots: int, buffers: PoolBuffers | None) -> None:
        self.num_slots = num_slots
        self.buffers = buffers
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._is_free = [True] * num_slots
        self.copies = 0  # state copies done (snapshots on match and checkpoints)
        self.handed_out = 0  # alloc() calls that returned a slot: the engine sizes its idle reserve from this
        # Per-slot tensors [num_slots, ...] another component keeps as part of "the state after n tokens" (the MTP
        # drafter: the target's last hidden state), so every snapshot, checkpoint and hand-over carries them too.
        self.extra: list[torch.Tensor] = []
        # Slots whose buffers have been written since start-up (or since resize): the rest are pages the kernel
        # has not faulted in yet (the pools are allocated untouched).
        self._written: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        if not self._free:
            return None
        slot = self._free.pop()
        self._is_free[slot] = False
        self.handed_out += 1
        return slot

    def free(self, slot: int) -> None:
        if self._is_free[slot]:
            raise RuntimeError(f"state slot {slot} freed twice")
        self._is_free[slot] = True
        self._free.append(slot)

    def resize(self, capacity: int, owned: Iterable[int] | None = None) -> None:
        """Start over as a pool of slot ids [0, capacity) that owns `owned` of them (all by default), all free;
        refused while any slot is allocated (the elastic pool lays its chunks out at start-up)."""
        if len(self._free) != self.num_slots:
            raise RuntimeError(f"state pool resized with {self.num_slots - len(self._free)} slots in use")
        mine = sorted(set(range(capacity) if owned is None else owned), reverse=True)
        if mine and not 0 <= mine[-1] <= mine[0] < capacity:
            raise ValueError(f"state slots {mine[-1]}..{mine[0]} are outside a pool of {capacity} slots")
        self._is_free = [False] * capacity
        for slot in mine:
            self._is_free[slot] = True
        self._free = mine  # lowest slots first, as a new pool
        self.num_slots = len(mine)
        self._written.clear()  # the elastic pool lays out its chunks anew: assume nothing is faulted in

    def take(self, slot: int) -> None:
        """Take a free slot out of the pool (the elastic pool gives its bytes to KV)."""
        if not self._is_free[slot]:
            raise RuntimeError(f"state slot {slot} taken out of the pool while in use")
        self._free.remove(slot)
        self._is_free[slot] = False
        self.num_slots -= 1

    def give(self, slot: int) -> None:
        """A slot the pool did not have, free (the elastic pool moved its bytes here)."""
        if self._is_free[slot]:
            raise RuntimeError(f"state slot {slot} given to the pool twice")
        self._is_free[slot] = True
        self._free.append(slot)
        self._written.discard(slot)  # its bytes are another chunk's: not faulted in as state
        self.num_slots += 1

    def free_slots(self) -> list[int]:
        return list(self._free)

    def carry(self, per_slot: torch.Tensor) -> None:
        """Keep `per_slot` ([capacity, ...]) with every slot's state: zeroed, copied and snapshotted with it."""
        if per_slot.shape[0] < len(self._is_free):
            raise ValueError(f"a per-slot tensor of {per_slot.shape[0]} rows for {len(self._is_free)} state slots")
        self.extra.append(per_slot)

    def zero(self, slot: int) -> None:
        self._written.add(slot)
        for t in self._slot_tensors():
            t[slot].zero_()

    def copy(self, src: int, dst: int) -> None:
        self.copies += 1
        self._written.add(dst)
        for t in self._slot_tensors():
            t[dst].copy_(t[src])

    @property
    def slot_bytes(self) -> int:
        """Bytes one slot holds across every buffer (0 without buffers)."""
        return sum(t[0].numel() * t.element_size() for t in self._slot_tensors() if t.shape[0] > 0)

    def next_unwritten(self, count: int) -> list[int]:
        """Those of the next `count` free slots the allocator will hand out (the top of its stack) that were never
        written since start-up: their pages are not faulted in yet."""
        return [slot for slot in reversed(self._free[-count:] if count > 0 else []) if slot not in self._written]

    def prefault(self, count: int, stop: Callable[[], bool] | None = None) -> int:
        """Zero next_unwritten(count), one layer's tensor at a time, giving up as soon as `stop()` says so (a
        request arrived: it must not wait for this); returns how many slots were finished. The engine calls it
        when idle: a fresh slot's first write (a request's copy of a cached state, ~0.4 MB for the peer model)
        otherwise faults its pages in on the request's critical path (~0.4 of a cached prompt's ~1.1 ms
        schedule). Only free slots are touched, so no state is lost, and the free list keeps its order."""
        done = 0
        for slot in self.next_unwritten(count):
            for t in self._slot_tensors():
                if stop is not None and stop():
                    return done
                zero_releasing_the_gil(t[slot])
            self._written.add(slot)
            done += 1
        return done

    def _slot_tensors(self) -> list[torch.Tensor]:
        per_layer = [] if self.buffers is None else [*self.buffers.conv, *self.buffers.ssm]
        return [*self.extra, *per_layer]

    def read(self, slot: int) -> list[torch.Tensor]:
        """Clones of the slot's tensors (tests compare states with this)."""
        if self.buffers is None:
            return []
        return [t[slot].clone() for t in (*self.buffers.conv, *self.buffers.ssm)]
