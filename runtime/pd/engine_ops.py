"""The two PD steps that touch the pools; both run on the engine thread, between scheduler steps.

`stage`: a prefill request is about to free its memory; copy its prompt KV and its state out first.
`inject`: a decode request whose transfer arrived takes a state slot and a KV reservation like any admitted
request, gets the transferred KV and state written in, and joins the running batch at its first output token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from runtime.core.requests import GenerateRequest, RequestOutput
from runtime.pd.protocol import Staged, TransferError
from runtime.scheduler.request import Req
from runtime.scheduler.transferred import Transferred

if TYPE_CHECKING:
    from runtime.engine.engine_core import EngineCore

logger = logging.getLogger("runtime.pd")


def stage(core: EngineCore, req: Req) -> Staged | None:
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
    core: EngineCore,
    g: GenerateRequest,
    on_output: Callable[[RequestOutput], None],
    head: dict[str, Any],
    tensors: list[tuple[str, torch.Tensor]],
) -> str | None:
    """Admit the transferred request. Returns None when done, "wait" when memory is short (retry later).

    Raises TransferError for a request that can never be admitted here (the message says why).
    """
    prompt_len = len(g.input_ids)
    if head["prompt_len"] != prompt_len:
        raise TransferError(
            f"the prefill server computed {head['prompt_len']} prompt tokens but this request has {prompt_len}: "
            "the router sent different prompts to the two servers", retryable=False,
        )  # fmt: skip
    buffers = core.pools.buffers
    by_name = dict(tensors)

    def write(slot: int, locs: torch.Tensor) -> None:
        for i, (k, v) in enumerate(zip(buffers.k, buffers.v, strict=True)):
            k[locs] = by_name[f"k.{i}"].to(k.device)
            v[locs] = by_name[f"v.{i}"].to(v.device)
        for i, (conv, ssm) in enumerate(zip(buffers.conv, buffers.ssm, strict=True)):
            conv[slot].copy_(by_name[f"conv.{i}"])
            ssm[slot].copy_(by_name[f"ssm.{i}"])

    first_logprob = head.get("first_logprob")
    transferred = Transferred(
        first_token=int(head["first_token"]),
        first_logprob=float(first_logprob) if first_logprob is not None else None,
        cached_tokens=int(head.get("cached_tokens", 0)),
    )
    admission = core.admit_transferred(g, on_output, transferred, write)
    if admission.ok:
        return None
    if admission.message:
        raise TransferError(admission.message, retryable=False)
    return "wait"
