"""n > 1: each prompt's request fanned out into n continuations, in SGLang's order and shapes.

SGLang expands a batch of B prompts with n samples each into B*n requests, prompt-major (output i*n + j is
sample j of prompt i), each with a fresh rid; a single prompt with n > 1 is answered as a batch (a list, and
stream chunks carry their `index`). Here continuation 0 of a prompt prefills it and continuations 1..n-1 name it
in `GenerateRequest.fork_of`: the scheduler forks them off its prefill (runtime/scheduler/fork.py) instead of
computing the prompt again. A seeded request gives each continuation its own seed derived from the client's,
so the n samples differ and the same request reproduces them.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from runtime.server.generate_request import PreparedRequest, RequestValueError


def fan_out(per_prompt: list[PreparedRequest]) -> list[PreparedRequest]:
    """The B*n requests for B prepared prompts, prompt-major; `per_prompt` unchanged when n == 1."""
    n = common_n([p.n for p in per_prompt])
    if n == 1:
        return per_prompt
    if any(p.request.bootstrap_room is not None for p in per_prompt):
        raise RequestValueError("n > 1 is not supported with PD disaggregation (bootstrap_room) by the bundled runtime")
    out: list[PreparedRequest] = []
    for i, prepared in enumerate(per_prompt):
        first_rid = ""
        for j in range(n):
            sampling = prepared.request.sampling.for_continuation(j)
            rid = uuid.uuid4().hex  # as SGLang's regenerate_rid: every sample gets its own id
            request = replace(prepared.request, rid=rid, sampling=sampling, fork_of=first_rid if j else None)
            first_rid = first_rid or rid
            out.append(replace(prepared, index=i * n + j, request=request, n=n))
    return out


def common_n(ns: list[int]) -> int:
    """The one n of a batch: SGLang refuses sampling_params entries with different n."""
    if len(set(ns)) > 1:
        raise RequestValueError("The parallel_sample_num should be the same for all samples in sample params.")
    return ns[0] if ns else 1
