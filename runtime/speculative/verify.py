"""Accepting drafts against one verify forward's logits (the KV of rejected positions goes back through
`CacheManager.truncate`).

Verify input per request: the last accepted token x0 and drafts d1..dk at positions L..L+k. Row j of the
logits predicts the token after position L + j. The target's own choice y_j at every row (argmax for greedy, a
sample with the request's own parameters otherwise) decides: d_{j+1} is accepted while it equals y_j; the
first mismatch emits y_j instead (the "bonus" token), so a round emits accepted + 1 tokens. Each emitted token
is exactly what plain decoding would have produced from the same prefix: for greedy requests the output is
token-identical, for sampled ones the distribution is the target's."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.core.requests import SamplingParams
from runtime.scheduler.sampling import sample


@dataclass(frozen=True)
class RoundResult:
    emitted: list[int]  # accepted drafts + the target's token at the first mismatch (or after the last draft)
    accepted_drafts: int
    logprobs: list[float] | None  # of each emitted token, when asked for


def accept_drafts(
    drafts: list[int],
    logits: torch.Tensor,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    with_logprobs: bool = False,
) -> RoundResult:
    """logits: [k + 1, vocab] for one request's verify rows."""
    rows = logits.shape[0]
    assert rows == len(drafts) + 1, f"{rows} verify rows for {len(drafts)} drafts"
    targets = sample(logits, [sampling] * rows, [generator] * rows)
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
        accepted += 1
    emitted = drafts[:accepted] + [targets[accepted]]
    logprobs = None
    if with_logprobs:
        lp = torch.log_softmax(logits[: len(emitted)].float(), dim=-1)
        logprobs = [float(lp[j, t]) for j, t in enumerate(emitted)]
    return RoundResult(emitted, accepted, logprobs)
