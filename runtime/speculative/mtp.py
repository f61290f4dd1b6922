"""NEXTN / EAGLE drafting from a Qwen3-Next checkpoint's multi-token-prediction (MTP) layer.

The MTP head (SGLang: models/qwen3_next_mtp.py) predicts the token after next: at position p it takes the
target's final hidden state h_p and the embedding of token p + 1, mixes them
(`fc(cat(norm_e(embed(t_{p+1})), norm_h(h_p)))`), runs one full-attention decoder layer (its own K/V at every
position) and the target's lm_head. Chained drafting feeds its own output hidden state back in place of the
target's for the positions the target has not run yet.

Hidden states come from a forward hook on the target's last decoder layer (prefill chunks and verify forwards
both pass through it), kept per state slot and position until the MTP has consumed them. The MTP's K/V live in
a buffer indexed by the target's KV token slots (as SGLang's draft KV pool mirrors the target's), shifted by one:
position p's K/V, a function of tokens [0, p + 1], sits at the slot of position p + 1, so a KV page of the prefix
cache holds only MTP K/V that every path through it agrees on, and a cache hit brings them along. What a hit at
m cannot bring, position m - 1 (its token m is the new request's own), is computed from h_{m-1}, which every
state slot carries beside the recurrent state (`last_hidden`, copied with it). After each prefill forward the
MTP runs over the positions whose next token is known (`after_prefill`), and a finishing request completes its
last round's positions (`release`), so whatever goes into the cache is complete. Drafted positions' K/V go to
scratch slots and are recomputed from the target's real hidden states next round. Drafts only propose: whatever
the MTP gets wrong is rejected by the verify forward, never emitted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from runtime.core.batch import ForwardBatch, PoolBuffers
from runtime.core.speculative_config import SpecConfigError
from runtime.models.base import StepContext
from runtime.models.layers.norm import ZeroCenteredRMSNorm
from runtime.models.qwen3_next import Qwen3NextDecoderLayer, Qwen3NextForCausalLM

if TYPE_CHECKING:
    from runtime.kvcache.cache_manager import CacheManager
    from runtime.scheduler.request import Req


def mtp_target(model: nn.Module) -> Qwen3NextForCausalLM:
    """`model` as the target an MTP drafter drafts for; SpecConfigError (why not, what to use instead) otherwise."""
    extra = getattr(model, "extra_weights", {})
    if not any(name.startswith("mtp.") for name in extra):
        raise SpecConfigError(
            f"--speculative-algorithm NEXTN/EAGLE drafts from the checkpoint's MTP layer, but "
            f"{type(model).__name__}'s checkpoint has no mtp.* weights. Use NGRAM, or STANDALONE with "
            f"[speculative] speculative_draft_model_path in config.toml."
        )
    if not isinstance(model, Qwen3NextForCausalLM) or model.config.split_projections:
        raise SpecConfigError(
            f"--speculative-algorithm NEXTN/EAGLE: the bundled runtime drafts from Qwen3-Next's MTP layer "
            f"only, not {type(model).__name__}'s; use NGRAM or STANDALONE ([speculative] "
            f"speculative_algorithm in config.toml)."
        )
    return model


class Qwen3NextMTP(nn.Module):
    """The MTP head; embeddings, lm_head and RoPE are the target's (SGLang shares them the same way)."""

    def __init__(self, target: Qwen3NextForCausalLM) -> None:
        super().__init__()
        c = target.config
        hidden = c.hidden_size
        one_layer = dataclasses.replace(
            c, num_hidden_layers=1, layer_types=("full_attention",), mlp_only_layers=(), decoder_sparse_step=1
        )
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = ZeroCenteredRMSNorm(hidden, c.rms_norm_eps)
        self.pre_fc_norm_hidden = ZeroCenteredRMSNorm(hidden, c.rms_norm_eps)
        self.layer = Qwen3NextDecoderLayer(one_layer, 0, 0)
        self.norm = ZeroCenteredRMSNorm(hidden, c.rms_norm_eps)
        self._target = [target]  # not a submodule: its parameters are the target's

    def load_from(self, extra: dict[str, torch.Tensor]) -> None:
        """Fill every parameter from the checkpoint's mtp.* tensors (per-expert tensors stacked as the
        target's MoE does); a missing or mis-shaped tensor raises with its name."""
        from runtime.models.layers.moe import SparseMoE

        num_experts = self._target[0].config.num_experts
        sources = SparseMoE.checkpoint_sources("mtp.layers.0.mlp", num_experts) if num_experts else {}
        with torch.no_grad():
            for name, param in self.named_parameters():
                stored = "mtp." + name if not name.startswith("layer.") else "mtp.layers.0." + name[6:]
                names = sources.get(stored, [stored])
                missing = [n for n in names if n not in extra]
                if missing:
                    raise ValueError(f"the checkpoint's MTP layer lacks tensor '{missing[0]}'")
                value = torch.cat([extra[n] for n in names]) if len(names) > 1 else extra[names[0]]
                if value.numel() != param.numel():
                    raise ValueError(
                        f"MTP tensor '{names[0]}' has shape {tuple(value.shape)}; parameter needs {tuple(param.shape)}"
                    )
                param.copy_(value.view(param.shape).to(param.dtype))

    def forward(
        self, batch: ForwardBatch, buffers: PoolBuffers, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits of every row [T, vocab], the MTP's normed output hidden [T, hidden])."""
        out = self.norm(self.mixed(batch, buffers, hidden))
        return self._target[0].lm_head(out).float(), out

    def mixed(self, batch: ForwardBatch, buffers: PoolBuffers, hidden: torch.Tensor) -> torch.Tensor:
        """The decoder layer's output rows [T, hidden] (pre-norm); writes every row's K/V at batch.out_locs."""
        target = self._target[0]
        device = self.fc.weight.device
        ctx = StepContext.build(batch, buffers, device)
        embeds = target.body.embed(batch.input_ids.to(device))
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        rotary = target.rotary
        assert rotary is not None, "Qwen3-Next attention is rotary"
        return self.layer(x, rotary.cos_sin(ctx.positions, x.dtype), ctx)


@dataclass
class _MtpSeq:
    req: Req
    slot: int  # the request's state slot: the key of its captured hidden states
    done: int  # positions [0, done) have MTP K/V from the target's real hidden states


@dataclass
class _Span:
    """MTP rows for positions [first, first + len(ids)) of one sequence. Row p mixes h_p with token p + 1 and
    writes its K/V at the target's token slot of position p + 1 (`slots`: target slots from position 0 on)."""

    ids: list[int]
    first: int
    rows: list[torch.Tensor]
    slots: torch.Tensor

    @property
    def end(self) -> int:
        return self.first + len(self.ids)


class MtpDrafter:
    def __init__(
        self,
        model: Qwen3NextForCausalLM,
        num_drafts: int,
        *,
        cache: CacheManager,
        max_running_requests: int,
        token_capacity: int,
        dtype: torch.dtype,
        device: str,
    ) -> None:
        self.target = model
        self.num_drafts = num_drafts
        self.cache = cache
        self.mtp = Qwen3NextMTP(model).to(dtype=dtype, device=device)
        self.mtp.load_from(model.extra_weights)
        self.mtp.eval()
        layout = model.layout()
        self.scratch_first = token_capacity
        scratch = max_running_requests * max(num_drafts - 1, 1)
        shape = (token_capacity + scratch, layout.num_kv_heads)
        self.buffers = PoolBuffers(
            k=[torch.zeros(*shape, layout.head_dim, dtype=dtype, device=device)],
            v=[torch.zeros(*shape, layout.v_head_dim, dtype=dtype, device=device)],
            conv=[],
            ssm=[],
        )
        # The target's hidden state at position n - 1 is part of "the state after n tokens" for the MTP: a request
        # that resumes there mixes it with its own token n. It lives beside the recurrent state in every slot, so
        # the pool's copies (checkpoints, snapshots on a hit) carry it.
        pool = cache.state_pool
        self.last_hidden = torch.zeros(pool.num_slots, model.config.hidden_size, dtype=dtype, device=device)
        pool.carry(self.last_hidden)
        self.hidden: dict[int, dict[int, torch.Tensor]] = {}  # state slot -> position -> pre-norm hidden
        self.seqs: dict[str, _MtpSeq] = {}
        model.body.layers[-1].register_forward_hook(self._capture)

    @property
    def state_bytes(self) -> int:
        """Memory the per-slot hidden states add to the state pool (outside its budget, as the MTP K/V)."""
        return self.last_hidden.numel() * self.last_hidden.element_size()

    def _capture(self, module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> None:
        ctx = args[2]
        batch: ForwardBatch = ctx.batch
        rows = output.detach()
        start = 0
        slots = batch.state_slots.tolist()
        for slot, pre, n in zip(slots, batch.prefix_lens, batch.extend_lens, strict=True):
            store = self.hidden.setdefault(int(slot), {})
            for p in [p for p in store if p >= pre + n]:
                del store[p]  # beyond the newest write: rejected drafts, or an earlier owner of the slot
            for j in range(n):
                store[pre + j] = rows[start + j].clone()
            start += n

    @torch.inference_mode()
    def after_prefill(self, batch: ForwardBatch) -> None:
        """Right after a prefill forward: the MTP K/V of every position whose next token is now known (so the KV
        pages the forward's checkpoints hand the cache carry theirs), and the hidden state that goes with each
        state the forward wrote (the sequence's own slot and every in-forward checkpoint)."""
        spans: list[_Span] = []
        start = 0
        for i, (slot, pre, n) in enumerate(
            zip(batch.state_slots.tolist(), batch.prefix_lens, batch.extend_lens, strict=True)
        ):
            store = self.hidden.pop(int(slot), {})
            if pre > 0:
                store[pre - 1] = self.last_hidden[slot].clone()  # the slot's state came with it
            first = max(pre - 1, 0)
            if first < pre + n - 1:
                ids = batch.input_ids[start + first + 1 - pre : start + n].tolist()
                rows = [store[p] for p in range(first, pre + n - 1)]
                spans.append(_Span(ids, first, rows, batch.kv_locs[i]))
            self.last_hidden[slot] = store[pre + n - 1]
            for k, cp_slot in batch.state_checkpoints[i] if batch.state_checkpoints else []:
                self.last_hidden[cp_slot] = store[pre + k - 1]
            start += n
        if spans:
            self._mix(spans)

    def release(self, rid: str) -> None:
        """Before the request's memory goes back (its end state maybe into the cache): the MTP K/V of the
        positions its last round accepted, and the hidden state of its last position beside its state."""
        seq = self.seqs.pop(rid, None)
        if seq is None:
            return  # never drafted: after_prefill left its state and KV pages complete
        store = self.hidden.pop(seq.slot, {})
        mem = seq.req.mem
        if mem is None or mem.slot != seq.slot or mem.kv_len - 1 not in store:
            return
        end = mem.kv_len - 1
        if seq.done < end:
            tokens = seq.req.all_ids
            rows = [store[p] for p in range(seq.done, end)]
            with torch.inference_mode():
                self._mix([_Span(tokens[seq.done + 1 : end + 1], seq.done, rows, self.cache.token_slots(mem, end + 1))])
        self.last_hidden[seq.slot] = store[end]

    def _mix(self, spans: list[_Span]) -> torch.Tensor:
        """One MTP extend over the spans; returns the layer's output rows (pre-norm), K/V written."""
        batch = ForwardBatch(
            mode="extend",
            input_ids=torch.tensor([t for s in spans for t in s.ids], dtype=torch.int64),
            positions=torch.cat([torch.arange(s.first, s.end, dtype=torch.int64) for s in spans]),
            extend_lens=[len(s.ids) for s in spans],
            prefix_lens=[s.first for s in spans],
            kv_locs=[s.slots[1 : s.end + 1] for s in spans],
            out_locs=torch.cat([s.slots[s.first + 1 : s.end + 1] for s in spans]),
            state_slots=torch.zeros(len(spans), dtype=torch.int64),
            all_logits=True,
        )
        normed = self.target.body.final_norm(torch.stack([r for s in spans for r in s.rows]))
        return self.mtp.mixed(batch, self.buffers, normed)

    @torch.inference_mode()
    def propose(self, reqs: list[Req]) -> list[list[int]]:
        seqs = []
        for r in reqs:
            assert r.mem is not None and r.mem.slot is not None
            seq = self.seqs.get(r.rid)
            if seq is None:
                # after_prefill wrote the MTP K/V of positions [0, kv_len - 1) and left h_{kv_len - 1} in the slot.
                seq = self.seqs[r.rid] = _MtpSeq(r, r.mem.slot, r.mem.kv_len - 1)
                self.hidden[seq.slot] = {seq.done: self.last_hidden[seq.slot].clone()}
            seqs.append(seq)
        first, hidden = self._catch_up(reqs, seqs)
        drafts = [[t] for t in first]
        if self.num_drafts > 1:
            self._chain(reqs, drafts, hidden)
        return drafts

    def _catch_up(self, reqs: list[Req], seqs: list[_MtpSeq]) -> tuple[list[int], torch.Tensor]:
        """One extend over positions [done, kv_len) of every request with the target's hidden states; the
        last row of each predicts draft 1. Its K/V goes to the slot of position kv_len, which the verify forward
        fills anyway (grown here from the request's reservation)."""
        spans: list[_Span] = []
        for r, seq in zip(reqs, seqs, strict=True):
            assert r.mem is not None
            end = r.mem.kv_len  # = len(all_ids) - 1: positions with a target hidden state
            store = self.hidden.get(seq.slot, {})
            slots = torch.cat([self.cache.token_slots(r.mem, end), torch.tensor(self.cache.grow(r.mem, 1))])
            spans.append(
                _Span(r.all_ids[seq.done + 1 : end + 1], seq.done, [store[p] for p in range(seq.done, end)], slots)
            )
            for p in [p for p in store if p < end]:
                del store[p]
            seq.done = end
        out = self.mtp.norm(self._mix(spans))
        last = torch.tensor([len(s.ids) for s in spans]).cumsum(0) - 1
        logits = self.target.lm_head(out[last]).float()
        return [int(t) for t in torch.argmax(logits, dim=-1)], out[last]

    def _chain(self, reqs: list[Req], drafts: list[list[int]], hidden: torch.Tensor) -> None:
        """Drafts 2..k: one decode step each at positions kv_len, kv_len + 1, ... fed with the MTP's own
        hidden state; their K/V go to scratch slots (dropped: next round recomputes them)."""
        # MTP position p's K/V sits at the target slot of position p + 1: positions [0, kv_len) -> slots 1..kv_len.
        history = [self.cache.token_slots(r.mem, r.mem.kv_len + 1)[1:] for r in reqs if r.mem is not None]
        width = max(self.num_drafts - 1, 1)
        for step in range(self.num_drafts - 1):
            locs = [self.scratch_first + i * width + step for i in range(len(reqs))]
            history = [torch.cat([h, torch.tensor([loc])]) for h, loc in zip(history, locs, strict=True)]
            batch = ForwardBatch(
                mode="decode",
                input_ids=torch.tensor([d[-1] for d in drafts], dtype=torch.int64),
                positions=torch.tensor([r.mem.kv_len + step for r in reqs if r.mem is not None]),
                extend_lens=[1] * len(reqs),
                prefix_lens=[r.mem.kv_len + step for r in reqs if r.mem is not None],
                kv_locs=history,
                out_locs=torch.tensor(locs, dtype=torch.int64),
                state_slots=torch.zeros(len(reqs), dtype=torch.int64),
            )
            logits, hidden = self.mtp(batch, self.buffers, hidden)
            for d, t in zip(drafts, torch.argmax(logits, dim=-1).tolist(), strict=True):
                d.append(int(t))
