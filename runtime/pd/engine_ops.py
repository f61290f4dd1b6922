"""The two PD steps that touch the pools; both run on the engine thread, between scheduler steps.

`stage`: a prefill request is about to free its memory; copy its prompt KV and its state out first.
`inject`: a decode request whose transfer arrived takes a state slot and a KV reservation like any admitted
request, gets the transferred KV and state written in, and joins the running batch at its first output token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from runtime.core.requests import GenerateRequest, RequestOutput
from runtime.pd.protocol import Staged, TransferError
from runtime.scheduler.request import Req
from runtime.scheduler.stopping import finish_reason_after

logger = logging.getLogger("runtime.pd")


def stage(core: Any, req: Req) -> Staged | None:
    """The finished prefill of `req`, or None when it did not get as far as its first token."""
    mem = req.mem
    if mem is None or mem.slot is None or not req.output_ids or mem.kv_len < len(req.prompt_ids):
        return None
    n = len(req.prompt_ids)
    buffers = core.pools.buffers
    locs = core.cache.token_slots(mem, n)
    tensors: list[tuple[str, torch.Tensor]] = []
    for i, (k, v) in enumerate(zip(buffers.k, buffers.v, strict=True)):
        tensors.append((f"k.{i}", k[locs].cpu()))
        tensors.append((f"v.{i}", v[locs].cpu()))
    for i, (conv, ssm) in enumerate(zip(buffers.conv, buffers.ssm, strict=True)):
        tensors.append((f"conv.{i}", conv[mem.slot].cpu().clone()))
        tensors.append((f"ssm.{i}", ssm[mem.slot].cpu().clone()))
    logprob = req.pending_logprobs[0] if req.pending_logprobs else None
    return Staged(list(req.prompt_ids), req.output_ids[0], logprob, tensors, req.cached_tokens)


def inject(
    core: Any,
    g: GenerateRequest,
    on_output: Callable[[RequestOutput], None],
    head: dict[str, Any],
    tensors: list[tuple[str, torch.Tensor]],
) -> str | None:
    """Admit the transferred request. Returns None when done, "wait" when memory is short (retry later).

    Raises TransferError for a request that can never be admitted here (the message says why).
    """
    sched = core.scheduler
    cache = core.cache
    prompt = list(g.input_ids)
    n = len(prompt)
    if head["prompt_len"] != n:
        raise TransferError(
            f"the prefill server computed {head['prompt_len']} prompt tokens but this request has {n}: the "
            "router sent different prompts to the two servers", retryable=False,
        )  # fmt: skip
    if len(sched.running) >= sched.config.max_running_requests:
        return "wait"
    req = Req(g.rid, prompt, g.sampling, on_output, g.return_logprob, sched.next_arrival())
    req.max_new_tokens = min(g.sampling.max_new_tokens, sched.config.context_len - n)
    if g.sampling.seed is not None:
        req.generator = sched.new_generator(g.sampling.seed)
    total = n + req.max_new_tokens - 1
    # One token of the prompt stands in for it: a transferred request never reuses this server's cached
    # prefixes (their pages would be overwritten with the transfer), and admit() then matches nothing.
    admission, mem = cache.admit(prompt[:1], total)
    if not admission.ok:
        if admission.message:
            raise TransferError(admission.message, retryable=False)
        return "wait"
    assert mem is not None and mem.slot is not None
    locs = torch.tensor(cache.grow(mem, n), dtype=torch.int64)
    buffers = core.pools.buffers
    by_name = dict(tensors)
    for i, (k, v) in enumerate(zip(buffers.k, buffers.v, strict=True)):
        k[locs] = by_name[f"k.{i}"].to(k.device)
        v[locs] = by_name[f"v.{i}"].to(v.device)
    for i, (conv, ssm) in enumerate(zip(buffers.conv, buffers.ssm, strict=True)):
        conv[mem.slot].copy_(by_name[f"conv.{i}"])
        ssm[mem.slot].copy_(by_name[f"ssm.{i}"])
    mem.kv_len = n
    req.mem = mem
    counters = sched.counters
    counters.num_requests_total += 1
    counters.prompt_tokens_total += n
    # The prefix cache that served this prompt is the prefill server's: report its hits, as one server would.
    req.cached_tokens = int(head.get("cached_tokens", 0))
    counters.cached_tokens_total += req.cached_tokens
    counters.generation_tokens_total += 1
    first = int(head["first_token"])
    req.output_ids.append(first)
    req.pending_ids.append(first)
    if g.return_logprob and head.get("first_logprob") is not None:
        req.pending_logprobs.append(float(head["first_logprob"]))
    sched.running.append(req)
    reason = finish_reason_after(req, first, sched.eos_token_ids, sched.tokenizer)
    if reason is not None:
        sched.finish_running(req, reason)
    else:
        on_output(req.take_output())
    return None
