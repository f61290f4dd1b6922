"""A step's batch and the memory it takes: the KV slots its new tokens are written to, each sequence's KV to attend
over, its state slot and the checkpoint slots the forward fills (`ScheduledBatch`). The scheduler decides which
requests run and how many tokens each computes; this builds their batch (a mixed step's too, and splits its
logits back into its two parts: `split_mixed`).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from runtime.core.batch import ScheduledBatch
from runtime.kvcache.cache_manager import CacheManager
from runtime.scheduler import logprobs as lp
from runtime.scheduler.checkpoints import CheckpointPlanner
from runtime.scheduler.request import Req


class BatchBuilder:
    def __init__(self, cache: CacheManager, checkpoints: CheckpointPlanner) -> None:
        self.cache = cache
        self.checkpoints = checkpoints

    def extend(self, items: list[tuple[Req, list[int]]], *, all_logits: bool = False) -> ScheduledBatch[Req]:
        """An extend batch that appends `tokens` after each request's cached ones, taking KV slots for them
        (a prefill chunk here; a verify round's last token and drafts in runtime/speculative)."""
        out_locs: list[int] = []
        kv_locs: list[torch.Tensor] = []
        starts: list[int] = []
        slots: list[int] = []
        for req, tokens in items:
            mem = req.mem
            assert mem is not None and mem.slot is not None
            start = mem.kv_len
            new_locs = self.cache.grow(mem, len(tokens))
            out_locs.extend(new_locs)
            # The slots of every token up to the chunk's end, through the page list's mirror (grow took the pages):
            # not a tensor of the new slots' Python ints joined to the old ones.
            kv_locs.append(self.cache.token_slots(mem, start + len(tokens)))
            starts.append(start)
            slots.append(mem.slot)
        return ScheduledBatch(
            mode="extend",
            reqs=[req for req, _ in items],
            tokens=[tokens for _, tokens in items],
            starts=starts,
            out_locs=out_locs,
            kv_locs=kv_locs,
            state_slots=slots,
            checkpoints=[[] for _ in items],
            all_logits=all_logits,
        )

    def prefill(self, chunks: list[tuple[Req, int]]) -> ScheduledBatch[Req]:
        """The prefill step of `chunks` (request, prompt tokens to compute now), with its checkpoint slots."""
        items: list[tuple[Req, list[int]]] = []
        for req, n in chunks:
            assert req.mem is not None
            items.append((req, req.prompt_ids[req.mem.kv_len : req.mem.kv_len + n]))
        # Prompt logprobs asked for: the forward returns every position's logits, not just each chunk's last.
        prompt_rows = any(lp.needs_prompt_rows(r, r.mem.kv_len, len(t)) for r, t in items if r.mem is not None)
        batch = self.extend(items, all_logits=prompt_rows)
        batch.checkpoints = [self.checkpoints.take_slots(req, len(tokens)) for req, tokens in items]
        batch.started = time.perf_counter()  # step_budget.PauseBudget times prefills too
        return batch

    def decode(self, reqs: list[Req]) -> ScheduledBatch[Req]:
        """One decode step of `reqs`: each request's last output token, a KV slot taken for it."""
        mems = [r.mem for r in reqs if r.mem is not None]
        out_locs, kv_locs = self.cache.grow_for_decode(mems)
        return ScheduledBatch(
            mode="decode",
            reqs=reqs,
            tokens=[[r.output_ids[-1]] for r in reqs],
            starts=[m.kv_len for m in mems],
            out_locs=out_locs,
            kv_locs=kv_locs,
            state_slots=[m.slot for m in mems if m.slot is not None],
            checkpoints=[[] for _ in reqs],
            started=time.perf_counter(),
        )

    def mixed(self, chunks: list[tuple[Req, int]], reqs: list[Req]) -> ScheduledBatch[Req]:
        """One forward of the prefill step of `chunks` and one decode row per request of `reqs` after them (an
        extend of one token after its cached ones, its last output token): SGLang's mixed chunk."""
        batch = self.prefill(chunks)
        decode = self.decode(reqs)
        batch.reqs += decode.reqs
        batch.tokens += decode.tokens
        batch.starts += decode.starts
        batch.out_locs += decode.out_locs
        batch.kv_locs += decode.kv_locs
        batch.state_slots += decode.state_slots
        batch.checkpoints += decode.checkpoints
        batch.decode_rows = len(reqs)
        batch.started = decode.started
        return batch


def split_mixed(
    batch: ScheduledBatch[Req], logits: torch.Tensor
) -> tuple[ScheduledBatch[Req], torch.Tensor, torch.Tensor]:
    """A mixed step's prefill part (a batch of its first requests), that part's logits, and one logits row per
    decode row (the batch's last `decode_rows` requests; their rows come last in either layout)."""
    n = batch.batch_size - batch.decode_rows
    prefill = dataclasses.replace(
        batch,
        reqs=batch.reqs[:n],
        tokens=batch.tokens[:n],
        starts=batch.starts[:n],
        kv_locs=batch.kv_locs[:n],
        state_slots=batch.state_slots[:n],
        checkpoints=batch.checkpoints[:n],
        decode_rows=0,
    )
    rows = logits.shape[0] - batch.decode_rows  # [B, vocab], or [T, vocab] with all_logits
    return prefill, logits[:rows], logits[rows:]
