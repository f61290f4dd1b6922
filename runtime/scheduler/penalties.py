"""Logit penalties and biases as SGLang 0.5.23 applies them before sampling (sampling/penaltylib/,
SamplingBatchInfo.apply_logits_bias), over a request's OUTPUT tokens so far (the prompt does not count):

- frequency_penalty: logit -= penalty * count(token in output)
- presence_penalty:  logit -= penalty if the token is in the output
- min_new_tokens:    EOS and stop token ids get -inf while fewer than min_new_tokens tokens are out
- repetition_penalty (multiplicative, after the additive ones): for a token in the output, a negative logit is
  multiplied by it and a positive one divided by it
- logit_bias (after the grammar mask in SGLang; there is none here): logit += bias[token]

Temperature, top-k/p and min-p come after (runtime/scheduler/sampling.py). Rows without any of these are left
alone, so a batch without penalties costs nothing and greedy output is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from runtime.core.requests import SamplingParams


def penalize_row(
    logits: torch.Tensor, p: SamplingParams, output_ids: Sequence[int], stop_ids: Sequence[int]
) -> torch.Tensor:
    """One row of logits ([vocab], float32) with SGLang's penalties applied, for a request that has produced
    `output_ids`; `stop_ids` are the ids min_new_tokens holds back (EOS and the request's stop_token_ids)."""
    out = logits.clone()
    vocab = out.numel()
    if output_ids and (p.frequency_penalty or p.presence_penalty or p.repetition_penalty != 1.0):
        ids = torch.tensor([t for t in output_ids if 0 <= t < vocab], dtype=torch.int64, device=out.device)
        counts = torch.bincount(ids, minlength=vocab).to(out.dtype)
        present = counts > 0
        if p.frequency_penalty:
            out -= p.frequency_penalty * counts
        if p.presence_penalty:
            out -= p.presence_penalty * present.to(out.dtype)
        if p.repetition_penalty != 1.0:
            scaled = torch.where(out < 0, out * p.repetition_penalty, out / p.repetition_penalty)
            out = torch.where(present, scaled, out)
    if p.min_new_tokens and len(output_ids) < p.min_new_tokens:
        blocked = [t for t in stop_ids if 0 <= t < vocab]
        if blocked:
            out[torch.tensor(blocked, dtype=torch.int64, device=out.device)] = float("-inf")
    if p.logit_bias:
        for token, bias in p.logit_bias.items():
            if 0 <= token < vocab:
                out[token] += bias
    return out


def apply_penalties(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    outputs: Sequence[Sequence[int]],
    eos_ids: Sequence[int],
) -> torch.Tensor:
    """`logits` ([batch, vocab]) with each row's penalties applied; the same tensor when no row has any."""
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    if not rows:
        return logits
    out = logits.float().clone()
    for i in rows:
        p = params[i]
        # As SGLang's min_new_tokens penalizer: EOS and stop ids, with or without ignore_eos.
        out[i] = penalize_row(out[i], p, outputs[i], p.stop_ids(eos_ids))
    return out
