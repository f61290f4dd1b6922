"""In-batch prefix sharing: which waiting request should wait for a prefix another request is computing now.

Requests that arrive together and share a long prompt prefix (a system prompt) would each compute it, because
none finds it in the tree at admission. SGLang schedules one of them first (in-batch prefix caching,
`IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD` / `_DEPRIORITIZE_THRESHOLD` in `schedule_policy.py`). Here a waiting
request is held back while a request in prefill (its leader) is about to put the state at a position of their
shared prefix into the tree, at least `min_tokens` past what the tree gives it now. It is admitted as soon as
the leader's prefill has passed that position (the checkpoint is then in the tree, or was skipped for lack of a
slot) or the leader leaves (finished, aborted). Running prefills are scheduled before admissions, so a leader
always progresses and nobody waits for long; a request that shares nothing with a prefill is never held back.

Where the shared prefix does not end on the checkpoint grid, the leader is asked to checkpoint its end too
(`Req.share_points`), so the follower resumes exactly there: the branch point, known before the leader computes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from runtime.kvcache.common_prefix import common_prefix_len
from runtime.scheduler.request import Req

# SGLang's IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD: below this gain recomputing beats waiting a step.
DEFAULT_MIN_TOKENS = 32


def shared_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix (runtime/kvcache/common_prefix.py: slice comparisons in C)."""
    return common_prefix_len(a, b)


def find_leader(
    req: Req,
    prefilling: Sequence[Req],
    *,
    min_tokens: int,
    page_size: int,
    cached_len: Callable[[Req], int],
    checkpoints_ahead: Callable[[Req, int], list[int]],
) -> Req | None:
    """The request in prefill that `req` should wait for, or None to admit it now.

    `cached_len(req)`: tokens the tree gives it now. `checkpoints_ahead(leader, end)`: prompt positions up to
    `end` whose state the leader has still to put into the tree.
    """
    if min_tokens <= 0 or not prefilling:
        return None
    prompt = req.prompt_ids[:-1]  # admission matches all but the last token, which is always computed
    cached: int | None = None
    for leader in prefilling:
        assert leader.mem is not None
        shared = shared_prefix_len(prompt, leader.prompt_ids)
        shared -= shared % page_size  # the tree holds whole pages only
        if shared <= leader.mem.kv_len or shared < min_tokens:
            continue  # the leader is past it already: whatever it checkpointed there is in the tree
        if cached is None:
            cached = cached_len(req)
        if shared - cached < min_tokens:
            continue
        if shared < len(leader.prompt_ids):
            leader.share_points.add(shared)
        ahead = checkpoints_ahead(leader, shared)
        if ahead and ahead[-1] - cached >= min_tokens:
            return leader
    return None
