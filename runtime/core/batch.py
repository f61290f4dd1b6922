"""The contract between the engine (scheduler, pools) and the model code.

The engine owns memory: it allocates the buffers in `PoolBuffers` from the model's `ModelLayout`, hands out KV
token slots and state slots, and builds one `ForwardBatch` per step. The model only reads and writes those buffers
at the indices it is given; it never allocates cache memory itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Generic, Literal, Protocol, TypeVar

import torch


@dataclass(frozen=True)
class ModelLayout:
    """What the engine needs to size and allocate the two pools for a model."""

    num_layers: int
    attn_layer_ids: tuple[int, ...]  # model layer index of each full-attention layer, in order
    linear_layer_ids: tuple[int, ...]  # model layer index of each linear-attention / Mamba layer, in order
    num_kv_heads: int  # per rank
    head_dim: int  # K head dim of full attention
    v_head_dim: int  # V head dim of full attention
    conv_state_shape: tuple[int, ...]  # per slot, per linear layer, e.g. (conv_dim, kernel - 1)
    ssm_state_shape: tuple[int, ...]  # per slot, per linear layer, e.g. (heads, k_dim, v_dim)
    vocab_size: int


@dataclass
class PoolBuffers:
    """Cache memory the model reads and writes. Index 0 of each list is the first layer of that kind."""

    k: list[torch.Tensor]  # per full-attention layer: [num_token_slots, num_kv_heads, head_dim]
    v: list[torch.Tensor]  # per full-attention layer: [num_token_slots, num_kv_heads, v_head_dim]
    conv: list[torch.Tensor]  # per linear layer: [num_state_slots, *conv_state_shape]
    ssm: list[torch.Tensor]  # per linear layer: [num_state_slots, *ssm_state_shape]


@dataclass
class ForwardBatch:
    """One model step over several sequences.

    extend: each sequence appends `extend_lens[i]` new tokens after `prefix_lens[i]` tokens already cached (their K/V
    in the KV pool and their recurrent state in `state_slots[i]`; a sequence with prefix_len 0 starts from a zeroed
    slot). decode: every extend_len is 1. The model writes the new tokens' K/V at `out_locs`, advances each
    sequence's state in place in its slot, and returns logits at the positions asked for.
    """

    mode: Literal["extend", "decode"]
    input_ids: torch.Tensor  # [T] int64, new tokens of all sequences concatenated
    positions: torch.Tensor  # [T] int64, absolute positions of those tokens
    extend_lens: list[int]  # new tokens per sequence
    prefix_lens: list[int]  # cached tokens per sequence
    kv_locs: list[torch.Tensor]  # per sequence: KV token-slot of every token 0..prefix+extend-1
    out_locs: torch.Tensor  # [T]: KV token-slot where each new token's K/V is written
    state_slots: torch.Tensor  # [B] int64: state-pool slot of each sequence
    # Logits: by default only for the last new token of each sequence ([B, vocab]). With all_logits the model
    # returns logits for every new token ([T, vocab]) — speculative verification needs them.
    all_logits: bool = False
    # extend only, per sequence: (new tokens consumed, destination state slot). During this one forward the linear
    # layers also write the conv window and recurrent state after that many of the sequence's new tokens into the
    # destination slot (the prefix cache's checkpoints), so a prompt need not be split where states are wanted.
    state_checkpoints: list[list[tuple[int, int]]] | None = None
    # extend only: the last `decode_rows` sequences are decoding requests riding along (a mixed step), one new
    # token each after their cached ones; recurrent layers advance their states with the decode kernels.
    decode_rows: int = 0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens)

    def prompt_chunks(self) -> ForwardBatch:
        """A mixed step's sequences before its decode rows, as an extend batch of their own."""
        n = self.batch_size - self.decode_rows
        tokens = sum(self.extend_lens[:n])
        return replace(
            self,
            input_ids=self.input_ids[:tokens],
            positions=self.positions[:tokens],
            extend_lens=self.extend_lens[:n],
            prefix_lens=self.prefix_lens[:n],
            kv_locs=self.kv_locs[:n],
            out_locs=self.out_locs[:tokens],
            state_slots=self.state_slots[:n],
            state_checkpoints=self.state_checkpoints[:n] if self.state_checkpoints else None,
            decode_rows=0,
        )

    def sequences(self) -> list[ForwardBatch]:
        """Each sequence of an extend batch (its decode rows included) as an extend batch of its own."""
        out: list[ForwardBatch] = []
        start = 0
        for i, length in enumerate(self.extend_lens):
            end = start + length
            out.append(
                replace(
                    self,
                    input_ids=self.input_ids[start:end],
                    positions=self.positions[start:end],
                    extend_lens=[length],
                    prefix_lens=[self.prefix_lens[i]],
                    kv_locs=[self.kv_locs[i]],
                    out_locs=self.out_locs[start:end],
                    state_slots=self.state_slots[i : i + 1],
                    state_checkpoints=[self.state_checkpoints[i]] if self.state_checkpoints else None,
                    decode_rows=0,
                )
            )
            start = end
        return out

    def decode_part(self) -> ForwardBatch:
        """A mixed step's decode rows as a decode batch of their own."""
        n = self.batch_size - self.decode_rows
        tokens = sum(self.extend_lens[:n])
        return ForwardBatch(
            mode="decode",
            input_ids=self.input_ids[tokens:],
            positions=self.positions[tokens:],
            extend_lens=self.extend_lens[n:],
            prefix_lens=self.prefix_lens[n:],
            kv_locs=self.kv_locs[n:],
            out_locs=self.out_locs[tokens:],
            state_slots=self.state_slots[n:],
        )


R = TypeVar("R")


@dataclass
class ScheduledBatch(Generic[R]):
    """What the scheduler decided for one step, before any tensor exists (`Scheduler.schedule`).

    Per request (`reqs[i]`, the scheduler's request type): `tokens[i]` are the new tokens this forward computes
    after `starts[i]` tokens already in KV and state, `out_locs` the KV token slots already taken for them (all
    requests concatenated), `kv_locs[i]` the KV token slots of all its tokens, `state_slots[i]` its state slot, and
    `checkpoints[i]` (new tokens consumed, spare slot) for each state the forward also writes (the prefix cache's
    checkpoints; a verify round's per-draft states). `ModelRunner.run` turns it into a `ForwardBatch` and logits;
    `Scheduler.postprocess` samples, emits and finishes.
    """

    mode: Literal["extend", "decode"]
    reqs: list[R]
    tokens: list[list[int]]
    starts: list[int]
    out_locs: list[int]
    kv_locs: list[torch.Tensor]
    state_slots: list[int]
    checkpoints: list[list[tuple[int, int]]]
    all_logits: bool = False
    # A speculative verify round (runtime/speculative/worker.py): each request's drafts, and the scratch slots
    # [B, D] its per-position states go to. None: an ordinary prefill or decode step.
    drafts: list[list[int]] | None = None
    scratch_slots: torch.Tensor | None = None
    # The forward the runner built for it (the drafter reads the prefill's hidden states off it).
    forward: ForwardBatch | None = None
    started: float = 0.0  # perf_counter when the step was scheduled (throughput gauge, step_budget.PauseBudget)
    # A mixed step (an extend): its last `decode_rows` requests are decoding, one token each after the prompt
    # chunks of the others (Scheduler.schedule).
    decode_rows: int = 0

    @property
    def batch_size(self) -> int:
        return len(self.reqs)

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


class BatchRunner(Protocol):
    """What runs a scheduled batch (runtime/engine/model_runner.py ModelRunner): tensors in, logits out."""

    def run(self, batch: ScheduledBatch) -> torch.Tensor: ...
