"""What the speculative round asks of a drafter, whatever the algorithm."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from runtime.core.batch import ForwardBatch
    from runtime.scheduler.request import Req


class Drafter(Protocol):
    num_drafts: int

    def propose(self, reqs: list[Req]) -> list[list[int]] | None:
        """Exactly `num_drafts` draft tokens per request, continuing `req.all_ids` (whose last token the
        target has not run yet); None when the drafter has nothing worth verifying for any of them, and the
        round is a plain decode step."""
        ...

    def after_prefill(self, batch: ForwardBatch) -> None:
        """The target just ran a prefill forward (its checkpoints about to go into the prefix cache)."""
        ...

    def release(self, rid: str) -> None:
        """The request is gone: drop whatever the drafter holds for it."""
        ...
