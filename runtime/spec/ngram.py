"""NGRAM drafting (prompt lookup): continue the sequence the way it continued the last time its tail appeared.

No draft weights. The longest tail (up to `max_match` tokens) that occurred earlier in the request's own
tokens wins, most recent occurrence first; the tokens that followed it are the drafts (copied with overlap, so
a short period keeps repeating). No match: the last token repeated, so every request verifies the same number
of tokens (a padded draft that is wrong is rejected like any other)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.core.batch import ForwardBatch
    from runtime.scheduler.request import Req


class NgramDrafter:
    def __init__(self, num_drafts: int, max_match: int = 4, min_match: int = 1) -> None:
        self.num_drafts = num_drafts
        self.max_match = max_match
        self.min_match = min_match

    def propose_one(self, tokens: Sequence[int]) -> list[int]:
        k = self.num_drafts
        n_tokens = len(tokens)
        drafts: list[int] = []
        for n in range(min(self.max_match, n_tokens - 1), self.min_match - 1, -1):
            tail = list(tokens[n_tokens - n :])
            # Most recent earlier occurrence whose continuation is inside the sequence.
            for start in range(n_tokens - n - 1, -1, -1):
                if tokens[start] == tail[0] and list(tokens[start : start + n]) == tail:
                    # Copy what followed, overlapping into the copy itself when it runs past the end (as
                    # LZ77 does): a sequence repeating with a short period keeps repeating.
                    ext = list(tokens)
                    for i in range(k):
                        ext.append(ext[start + n + i])
                    drafts = ext[n_tokens:]
                    break
            if drafts:
                break
        pad = drafts[-1] if drafts else tokens[-1]
        return drafts + [pad] * (k - len(drafts))

    def propose(self, reqs: list[Req]) -> list[list[int]]:
        return [self.propose_one(r.all_ids) for r in reqs]

    def after_prefill(self, batch: ForwardBatch) -> None:
        """Drafts come from the tokens alone."""

    def release(self, rid: str) -> None:
        """Nothing is held per request."""
