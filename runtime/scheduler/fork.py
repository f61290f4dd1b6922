"""n > 1 on one prefill: continuations forked off the request that computes their prompt.

The server sends continuation 0 of a prompt as an ordinary request and continuations 1..n-1 with
`GenerateRequest.fork_of` naming it (runtime/server/fanout.py). While that first request is queued or in
prefill, the others are held here, outside the waiting queue. When its prefill ends, each held request gets the
prompt's KV through the prefix cache (inserted and locked, no copy) and its own copy of the recurrent state
(one state-slot copy: the article's copy-on-write case), and samples its first token from the same logits row;
from then on it decodes like any other request. A fork is counted in `EngineStats.state_forks`
(`runtime:state_forks_total` on /metrics); its slot shows as in use in the pool counts.

Whatever cannot be forked (the first request finished or failed before its prefill ended, the prefix cache is
off, the prompt ends inside a KV page, no slot or pages free, speculative decoding on, the running cap reached)
goes to the waiting queue as an ordinary request: correct, only without the sharing.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from runtime.kvcache.cache_manager import CacheManager
from runtime.scheduler.request import Req
from runtime.scheduler.sampling import select_rows


class ForkHolds:
    """Requests held for the prefill of the request they fork off, by that request's rid."""

    def __init__(self) -> None:
        self._held: dict[str, list[Req]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self._held.values())

    def hold(self, req: Req, parent_rid: str | None, candidates: list[Req]) -> bool:
        """Hold `req` for `parent_rid` if that request is among `candidates` and has not finished its prefill."""
        if parent_rid is None:
            return False
        for parent in candidates:
            if parent.rid == parent_rid and not parent.finished and (parent.mem is None or parent.in_prefill):
                self._held.setdefault(parent_rid, []).append(req)
                return True
        return False

    def remove(self, rid: str) -> Req | None:
        """Take a held request out (an abort); None when no held request has that rid."""
        for parent_rid, reqs in self._held.items():
            for req in reqs:
                if req.rid == rid:
                    reqs.remove(req)
                    if not reqs:
                        del self._held[parent_rid]
                    return req
        return None

    def release(self, parent: Req) -> list[Req]:
        """The requests held for `parent` (now finished, failed, or done with its prefill), no longer held."""
        return self._held.pop(parent.rid, [])

    def fork(
        self,
        reqs: list[Req],
        logits: torch.Tensor,
        cache: CacheManager,
        *,
        can_run: Callable[[], bool],
        on_forked: Callable[[Req], None],
        on_unforked: Callable[[Req], None],
    ) -> tuple[list[Req], torch.Tensor]:
        """`reqs` just finished their prefill with these last-position `logits` rows: fork the requests held
        for them, returning the batch to sample (each parent followed by its forks, whose rows repeat the
        parent's). `can_run()`: the running cap has room; `on_forked` / `on_unforked` take each held request
        into the running batch / the waiting queue."""
        if not self._held:
            return reqs, logits
        out: list[Req] = []
        rows: list[int] = []
        for i, parent in enumerate(reqs):
            out.append(parent)
            rows.append(i)
            for child in self.release(parent):
                mem = None
                if parent.mem is not None and can_run():
                    total = len(child.prompt_ids) + child.max_new_tokens - 1
                    mem = cache.fork(parent.mem, parent.prompt_ids, total)
                if mem is None:
                    on_unforked(child)
                    continue
                child.mem = mem
                child.cached_tokens = mem.kv_len  # the whole prompt came from the fork, none computed
                on_forked(child)
                out.append(child)
                rows.append(i)
        if len(out) == len(reqs):
            return reqs, logits
        return out, select_rows(logits, rows)
