"""What the speculative round asks of a drafter, whatever the algorithm."""

from __future__ import annotations

from typing import Protocol


class Drafter(Protocol):
    num_drafts: int

    def propose(self, sequences: list[list[int]], rids: list[str]) -> list[list[int]]:
        """Exactly `num_drafts` draft tokens per sequence (each sequence ends with its last emitted token)."""
        ...

    def release(self, rid: str) -> None:
        """The request is gone: drop whatever the drafter holds for it."""
        ...
