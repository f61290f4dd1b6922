"""NGRAM drafting (prompt lookup): continue the sequence the way it continued the last time its tail appeared.

No draft weights. The longest tail (up to `max_match` tokens) that occurred earlier in the request's own
tokens wins, most recent occurrence first; the tokens that followed it are the drafts (copied with overlap, so
a short period keeps repeating). When no request of the batch has a match, `propose` returns None and the round is
a plain decode step: a verify forward of padded guesses reads the weights (and, for MoE, up to steps + 1 times the
experts) to accept almost nothing, which at a memory-bound size costs several decode steps. When some request has
a match, the others pad with their last token so every request verifies the same number of tokens (a padded draft
that is wrong is rejected like any other)."""

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
        """`num_drafts` tokens: the continuation of the longest matching tail, padded with the last token."""
        drafts = self.match(tokens)
        pad = drafts[-1] if drafts else tokens[-1]
        return drafts + [pad] * (self.num_drafts - len(drafts))

    def match(self, tokens: Sequence[int]) -> list[int]:
        """The continuation of the longest tail that occurred earlier (empty when none did)."""
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
        return drafts

    def propose(self, reqs: list[Req]) -> list[list[int]] | None:
        matches = [self.match(r.all_ids) for r in reqs]
        if not any(matches):
            return None
        k = self.num_drafts
        return [m + [m[-1] if m else r.all_ids[-1]] * (k - len(m)) for r, m in zip(reqs, matches, strict=True)]

    def after_prefill(self, batch: ForwardBatch) -> None:
        """Drafts come from the tokens alone."""

    def release(self, rid: str) -> None:
        """Nothing is held per request."""
