"""Log probabilities as SGLang 0.5.23 returns them (srt/layers/sampler.py, logprob_processor.py).

- Output tokens: the log-softmax of the logits the token was sampled from, after the grammar mask, divided by
  the request's temperature unless it is greedy (SGLang treats temperature 0 as 1), before top-k / top-p /
  min-p truncation. A token the mask forbids has -inf, which SGLang's JSON encoder writes as null.
- Prompt tokens (`logprob_start_len` >= 0): the log-softmax of the raw logits at each prompt position,
  no temperature. Entry k is the logprob of prompt token start+k given the tokens before it; entry 0 is always
  None (SGLang does not return it even when start > 0). Positions a prefix-cache hit would skip have no logits,
  so, as SGLang does, a request asking for prompt logprobs matches the cache only up to its start
  (`prefix_limit`) and the rest of its prompt is computed: every value the client asked for is returned.
"""

from __future__ import annotations

import math

import torch

from runtime.scheduler.request import Req
from runtime.scheduler.sampling import output_temperature

TopRow = list[tuple[float | None, int]]


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _rows(logprobs: torch.Tensor, tokens: list[int], top_n: int) -> tuple[list[float | None], list[TopRow]]:
    index = torch.tensor(tokens, dtype=torch.int64, device=logprobs.device).unsqueeze(1)
    picked = logprobs.gather(1, index).squeeze(1).tolist()
    tops: list[TopRow] = []
    if top_n > 0:
        values, ids = torch.topk(logprobs, min(top_n, logprobs.shape[-1]), dim=-1)
        tops = [
            [(_finite(v), i) for v, i in zip(vs, ixs, strict=True)]
            for vs, ixs in zip(values.tolist(), ids.tolist(), strict=True)
        ]
    return [_finite(v) for v in picked], tops


def record_output(req: Req, rows: torch.Tensor, tokens: list[int]) -> None:
    """Append the logprobs of `tokens` (one per row of `rows`, the logits they were sampled from)."""
    if not req.return_logprob or not tokens:
        return
    rows = rows[: len(tokens)]
    logprobs = torch.log_softmax(rows.float() / output_temperature(req.sampling), dim=-1)
    values, tops = _rows(logprobs, tokens, req.top_logprobs_num)
    req.pending_logprobs.extend(values)
    if req.top_logprobs_num > 0:
        req.pending_top_logprobs.extend(tops)


def prompt_start(req: Req) -> int:
    """First prompt position whose token's logprob the client asked for; len(prompt) when none."""
    if not req.return_logprob or req.logprob_start_len < 0:
        return len(req.prompt_ids)
    return min(req.logprob_start_len, len(req.prompt_ids))


def prefix_limit(req: Req) -> int | None:
    """The longest cached prefix the request may reuse (None: any), so every asked-for position is computed."""
    start = prompt_start(req)
    return start if start < len(req.prompt_ids) else None


def needs_prompt_rows(req: Req, chunk_start: int, chunk_len: int) -> bool:
    """Whether this prefill chunk holds positions whose logits give asked-for prompt logprobs."""
    start = prompt_start(req)
    return start < len(req.prompt_ids) - 1 and chunk_start + chunk_len > start and chunk_start < len(req.prompt_ids) - 1


def record_prompt(req: Req, chunk_start: int, rows: torch.Tensor) -> None:
    """Prompt logprobs from one prefill chunk's logits (`rows`: one per position from `chunk_start`).

    Position p predicts prompt token p + 1; the logits of the prompt's last position give the first output
    token, not a prompt logprob."""
    start = prompt_start(req)
    if start >= len(req.prompt_ids):
        return
    if req.input_logprobs is None:
        req.input_logprobs = [None]
        req.input_top_logprobs = [None]
    first = max(start, chunk_start)
    last = min(chunk_start + rows.shape[0], len(req.prompt_ids) - 1)
    if first >= last:
        return
    positions = rows[first - chunk_start : last - chunk_start]
    logprobs = torch.log_softmax(positions.float(), dim=-1)
    values, tops = _rows(logprobs, req.prompt_ids[first + 1 : last + 1], req.top_logprobs_num)
    req.input_logprobs.extend(values)
    if req.top_logprobs_num > 0 and req.input_top_logprobs is not None:
        req.input_top_logprobs.extend(tops)


def close_prompt(req: Req) -> None:
    """At the end of prefill: a request whose start is the prompt's last token still gets its [None] entry."""
    if prompt_start(req) < len(req.prompt_ids) and req.input_logprobs is None:
        req.input_logprobs = [None]
        req.input_top_logprobs = [None]
