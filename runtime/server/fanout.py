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

from runtime.core.requests import SamplingParams
from runtime.server.generate_request import PreparedRequest, RequestValueError

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: continuation seeds far apart from the client's


def continuation_seed(seed: int, j: int) -> int:
    """Continuation j's seed: the client's own for j == 0 (n == 1 samples as before), a mixed one after."""
    if j == 0:
        return seed
    z = (seed + j * _GOLDEN) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) >> 1  # 63 bits: a valid torch seed of either sign convention


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
            sampling = SamplingParams(**vars(prepared.request.sampling))
            if sampling.seed is not None:
                sampling.seed = continuation_seed(sampling.seed, j)
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
