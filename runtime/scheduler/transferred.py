"""Admitting a request whose prompt another engine computed (PD decode, runtime/pd): it joins the running batch
with its KV and state written in, at its first output token, as if this scheduler had prefilled it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from runtime.core.requests import GenerateRequest, RequestOutput
from runtime.kvcache.cache_manager import Admission
from runtime.scheduler.request import Req
from runtime.scheduler.scheduler import Scheduler


@dataclass(frozen=True)
class Transferred:
    """What the prefill engine computed for a transferred request besides its KV and state."""

    first_token: int
    first_logprob: float | None = None
    cached_tokens: int = 0


def admit_transferred(
    sched: Scheduler,
    g: GenerateRequest,
    on_output: Callable[[RequestOutput], None],
    transferred: Transferred,
    write: Callable[[int, torch.Tensor], None],
) -> Admission:
    """Admit a request whose prompt another engine computed (PD decode): it takes a state slot and a KV
    reservation like any admitted request, `write(slot, kv_locs)` fills in the prompt's KV and state, and it
    joins the running batch at its first output token. Not ok: wait (no message) or never (message)."""
    if len(sched.running) >= sched.config.max_running_requests:
        return Admission(False)
    prompt = list(g.input_ids)
    n = len(prompt)
    req = Req(g.rid, prompt, g.sampling, on_output, g.return_logprob, sched.next_arrival())
    sched.apply_sampling_limits(req, g)
    # One token of the prompt stands in for it: a transferred request never reuses this server's cached
    # prefixes (their pages would be overwritten with the transfer), and admit() then matches nothing.
    admission, mem = sched.cache.admit(prompt[:1], n + req.max_new_tokens - 1)
    if not admission.ok:
        return admission
    assert mem is not None and mem.slot is not None
    write(mem.slot, torch.tensor(sched.cache.grow(mem, n), dtype=torch.int64))
    mem.kv_len = n
    req.mem = mem
    sched.counters.num_requests_total += 1
    sched.counters.prompt_tokens_total += n
    # The prefix cache that served this prompt is the prefill server's: report its hits, as one server would.
    req.cached_tokens = transferred.cached_tokens
    sched.counters.cached_tokens_total += req.cached_tokens
    sched.running.append(req)
    logprobs = [transferred.first_logprob] if transferred.first_logprob is not None else None
    _, reason = sched.append_tokens(req, [transferred.first_token], logprobs if g.return_logprob else None)
    sched.emit(req, reason)
    return admission
