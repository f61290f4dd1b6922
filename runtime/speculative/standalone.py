"""STANDALONE drafting: a smaller model (any runtime-supported hybrid) drafts greedily from its own pools.

The draft keeps, per request, the KV of tokens [0, m) and the recurrent state after them in a private slot.
Each round it first catches up with one extend over the tokens accepted since (the last one's logits give
draft 1), then drafts 2..k with decode steps on a scratch copy of its state and scratch KV slots, which are
dropped afterwards: whatever the target rejects never reaches the draft's committed state. The scratch copy
is an in-forward checkpoint of the catch-up extend (the state after all its tokens, written into the scratch
slot too), not a copy per layer afterwards.

The draft's pools are its own (the target's sizing is untouched): KV for `token_capacity` tokens and two state
slots per running request. A request the draft pools cannot hold gets padding drafts (verified and rejected
like any other) and a warning, never a wrong token."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from runtime.core.batch import ForwardBatch
from runtime.core.buffers import allocate_pool_buffers
from runtime.kvcache.page_pool import KVPagePool
from runtime.kvcache.state_pool import StateSlotPool
from runtime.models.layers.state_checkpoints import supports_state_checkpoints

if TYPE_CHECKING:
    from runtime.scheduler.request import Req

logger = logging.getLogger("runtime.speculative")


@dataclass
class _DraftSeq:
    slot: int
    locs: list[int] = field(default_factory=list)  # KV token slot of each committed token

    @property
    def length(self) -> int:
        return len(self.locs)


class StandaloneDrafter:
    def __init__(
        self,
        model_path: str,
        num_drafts: int,
        *,
        max_running_requests: int,
        token_capacity: int,
        dtype: torch.dtype,
        device: str,
    ) -> None:
        from runtime.models.loader import load_model

        self.model = load_model(model_path, dtype=dtype, device=device)
        self.num_drafts = num_drafts
        layout = self.model.layout()
        self.num_slots = 2 * max_running_requests
        self.buffers = allocate_pool_buffers(
            layout, token_capacity, self.num_slots, kv_dtype=dtype, conv_dtype=dtype, device=device
        )
        self.kv = KVPagePool(token_capacity, 1)
        self.slots = StateSlotPool(self.num_slots, self.buffers)
        self.seqs: dict[str, _DraftSeq] = {}
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        # A draft whose layers cannot write in-forward checkpoints gets its scratch state by copying slots.
        self._scratch_in_forward = supports_state_checkpoints(self.model)
        self._warned = False

    def after_prefill(self, batch: ForwardBatch) -> None:
        """The draft model runs its own prefill at the request's first round."""

    def release(self, rid: str) -> None:
        seq = self.seqs.pop(rid, None)
        if seq is not None:
            self.kv.free(seq.locs)
            self.slots.free(seq.slot)

    def _seq_for(self, rid: str, need_tokens: int) -> _DraftSeq | None:
        seq = self.seqs.get(rid)
        if seq is None:
            slot = self.slots.alloc()
            if slot is None:
                return None
            self.slots.zero(slot)
            seq = self.seqs[rid] = _DraftSeq(slot)
        # New committed tokens + scratch drafts must fit, or this request drafts nothing this round.
        if self.kv.num_free < need_tokens + self.num_drafts:
            return None
        return seq

    @torch.inference_mode()
    def propose(self, reqs: list[Req]) -> list[list[int]]:
        sequences = [r.all_ids for r in reqs]
        rids = [r.rid for r in reqs]
        k = self.num_drafts
        drafts = [[seq[-1]] * k for seq in sequences]  # padding for requests the draft cannot hold
        live: list[tuple[int, _DraftSeq]] = []
        for i, (tokens, rid) in enumerate(zip(sequences, rids, strict=True)):
            seq = self._seq_for(rid, len(tokens) - self.seqs[rid].length if rid in self.seqs else len(tokens))
            if seq is None:
                self._warn_full(rid)
                continue
            live.append((i, seq))
        if not live:
            return drafts
        scratch: list[int] = []
        if k > 1:
            for _ in live:
                s = self.slots.alloc()
                assert s is not None  # two slots per running request
                scratch.append(s)
        try:
            first = self._catch_up([(sequences[i], seq) for i, seq in live], scratch)
            for (i, _), tok in zip(live, first, strict=True):
                drafts[i][0] = tok
            if k > 1:
                rest = self._draft_on_scratch([seq for _, seq in live], first, scratch)
                for (i, _), toks in zip(live, rest, strict=True):
                    drafts[i][1:] = toks
        finally:
            for s in scratch:
                self.slots.free(s)
        return drafts

    def _catch_up(self, items: list[tuple[list[int], _DraftSeq]], scratch: list[int]) -> list[int]:
        """One extend over each sequence's uncommitted tokens (at least its last one); greedy next tokens. The
        state after them also goes into the sequence's `scratch` slot, if given (where drafts 2..k run)."""
        ids: list[int] = []
        positions: list[int] = []
        out_locs: list[int] = []
        kv_locs: list[torch.Tensor] = []
        ext: list[int] = []
        pre: list[int] = []
        for tokens, seq in items:
            start = seq.length
            new = tokens[start:]
            locs = self.kv.alloc(len(new))
            assert locs is not None  # checked by _seq_for
            ids += new
            positions += range(start, start + len(new))
            out_locs += locs
            seq.locs += locs
            kv_locs.append(torch.tensor(seq.locs, dtype=torch.int64))
            ext.append(len(new))
            pre.append(start)
        fb = ForwardBatch(
            mode="extend",
            input_ids=torch.tensor(ids, dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64),
            extend_lens=ext,
            prefix_lens=pre,
            kv_locs=kv_locs,
            out_locs=torch.tensor(out_locs, dtype=torch.int64),
            state_slots=torch.tensor([seq.slot for _, seq in items], dtype=torch.int64),
            state_checkpoints=[[(n, s)] for n, s in zip(ext, scratch, strict=True)]
            if scratch and self._scratch_in_forward
            else None,
        )
        logits = self.model.forward(fb, self.buffers)
        if scratch and not self._scratch_in_forward:
            for (_, seq), s in zip(items, scratch, strict=True):
                for pool in (*self.buffers.conv, *self.buffers.ssm):
                    pool[s] = pool[seq.slot]
        return [int(t) for t in torch.argmax(logits, dim=-1)]

    def _draft_on_scratch(self, seqs: list[_DraftSeq], first: list[int], scratch: list[int]) -> list[list[int]]:
        temp: list[int] = []
        try:
            slots = torch.tensor(scratch, dtype=torch.int64)
            tokens = list(first)
            out: list[list[int]] = [[] for _ in seqs]
            history = [list(seq.locs) for seq in seqs]
            for step in range(self.num_drafts - 1):
                locs = self.kv.alloc(len(seqs))
                assert locs is not None  # reserved by _seq_for
                temp += locs
                for h, loc in zip(history, locs, strict=True):
                    h.append(loc)
                fb = ForwardBatch(
                    mode="decode",
                    input_ids=torch.tensor(tokens, dtype=torch.int64),
                    positions=torch.tensor([seq.length + step for seq in seqs], dtype=torch.int64),
                    extend_lens=[1] * len(seqs),
                    prefix_lens=[seq.length + step for seq in seqs],
                    kv_locs=[torch.tensor(h, dtype=torch.int64) for h in history],
                    out_locs=torch.tensor(locs, dtype=torch.int64),
                    state_slots=slots,
                )
                logits = self.model.forward(fb, self.buffers)
                tokens = [int(t) for t in torch.argmax(logits, dim=-1)]
                for o, t in zip(out, tokens, strict=True):
                    o.append(t)
            return out
        finally:
            self.kv.free(temp)

    def _warn_full(self, rid: str) -> None:
        if not self._warned:
            logger.warning(
                "STANDALONE draft pools are full: request %s gets padding drafts until others finish "
                "(the output is unaffected, only the accept length drops)",
                rid,
            )
            self._warned = True
