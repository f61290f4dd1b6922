"""Packed ⇄ padded views of an extend batch, built once per forward and shared by all recurrent layers.

Recurrent layers (conv, delta rule, SSD scan) run over a right-padded [B, Lmax, ...] batch so sequences of
different lengths go through one vectorized call; padded steps are made no-ops by the layer (zero update,
no decay).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from runtime.core.batch import ForwardBatch
from runtime.core.device_path import accelerator_path, upload
from runtime.models.layers.state_checkpoints import StateCheckpoints
from runtime.native.extend_kernels import NativeRefused, ShortExtendPlan

# A short extend (at most this many new tokens in the whole batch) runs its recurrent layers' sequential parts in
# C, token by token (runtime/native/extend_kernels.c); a longer one takes the chunked torch kernels, whose cost
# grows with the chunks, not the tokens. benchmarks/short_extend_cost.py, peer-model DeltaNet layer, one thread:
# C 3.0x faster at 48 tokens, 2.2x at 128, 1.4x at 256; 128 leaves room for torch's second thread on long chunks.
SHORT_EXTEND_MAX_TOKENS = 128


@dataclass
class SequencePacking:
    lens: torch.Tensor  # [B] int64, new tokens per sequence
    max_len: int
    gather_index: torch.Tensor  # [B, Lmax] index into the packed tokens (padding repeats a valid index)
    valid: torch.Tensor  # [B, Lmax] bool
    has_prefix: torch.Tensor  # [B] bool: the sequence continues a cached state
    state_slots: torch.Tensor  # [B] int64
    last_index: torch.Tensor  # [B] packed index of each sequence's last new token
    uniform: bool  # every sequence has max_len tokens (no padding)
    checkpoints: StateCheckpoints | None = None  # states to write mid-forward (ForwardBatch.state_checkpoints)
    # One sequence laid out as uniform (pad and unpad are views) whose steps from `lens` on are padding: a
    # compiled extend padded to its bucket's length (runtime/engine/compiled_extend.py).
    padded_tail: bool = False
    # [T]: each packed token's row in the flattened [B * Lmax] padding, for a batch that is not uniform (a gather:
    # boolean-mask indexing would read the mask back to size its output, a host sync on a GPU).
    unpad_index: torch.Tensor | None = None
    # Host-side copies for the short-extend kernels, set by `build` for a short batch (None: the torch path).
    host: tuple[list[int], list[bool], list[int]] | None = None
    _plan: ShortExtendPlan | None = field(default=None, init=False, repr=False)
    _plan_refused: bool = field(default=False, init=False, repr=False)

    @classmethod
    def build(cls, batch: ForwardBatch, device: torch.device) -> SequencePacking:
        lens = torch.tensor(batch.extend_lens, dtype=torch.int64)
        # The C kernels read host memory: the accelerator path never takes them.
        short = sum(batch.extend_lens) <= SHORT_EXTEND_MAX_TOKENS and not accelerator_path(device)
        max_len = int(lens.max())
        starts = torch.cumsum(lens, 0) - lens
        steps = torch.arange(max_len)[None, :]
        valid = steps < lens[:, None]
        gather_index = starts[:, None] + torch.minimum(steps, (lens - 1)[:, None])
        uniform = bool((lens == max_len).all())
        return cls(
            lens=upload(lens, device),
            max_len=max_len,
            gather_index=upload(gather_index, device),
            valid=upload(valid, device),
            unpad_index=None if uniform else upload(valid.view(-1).nonzero().view(-1), device),
            has_prefix=upload(torch.tensor([p > 0 for p in batch.prefix_lens]), device),
            state_slots=upload(batch.state_slots, device),
            last_index=upload(starts + lens - 1, device),
            uniform=uniform,
            checkpoints=StateCheckpoints.build(batch.state_checkpoints, batch.extend_lens, device)
            if batch.state_checkpoints
            else None,
            host=(list(batch.extend_lens), [p > 0 for p in batch.prefix_lens], batch.state_slots.tolist())
            if short
            else None,
        )

    def short_extend_plan(self) -> ShortExtendPlan | None:
        """The batch's facts for the short-extend C kernels, built once per forward and shared by every layer;
        None for a long batch, a compiled one, or one the kernels cannot take as is (then the torch path)."""
        if self._plan is not None or self._plan_refused or self.host is None:
            return self._plan
        ck = self.checkpoints
        if ck is not None and ck.traced_tokens is not None:
            self._plan_refused = True
            return None
        lens, has_prefix, slots = self.host
        try:
            self._plan = ShortExtendPlan.build(
                lens,
                has_prefix,
                slots,
                list(ck.seq) if ck else [],
                list(ck.tokens) if ck else [],
                ck.slots.tolist() if ck else [],
            )
        except NativeRefused:
            self._plan_refused = True
        return self._plan

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """[T, ...] → [B, Lmax, ...]; padded rows hold copies of a valid row (callers neutralize them)."""
        if self.uniform:
            return x.view(self.lens.numel(), self.max_len, *x.shape[1:])
        return x.index_select(0, self.gather_index.view(-1)).view(*self.gather_index.shape, *x.shape[1:])

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """[B, Lmax, ...] → [T, ...] in packed order."""
        if self.uniform:
            return x.reshape(-1, *x.shape[2:])
        assert self.unpad_index is not None
        return x.reshape(-1, *x.shape[2:]).index_select(0, self.unpad_index)

    def zero_padding(self, x: torch.Tensor) -> torch.Tensor:
        """Zero the padded steps of a [B, Lmax, ...] tensor."""
        if self.uniform and not self.padded_tail:
            return x
        mask = self.valid.view(*self.valid.shape, *([1] * (x.dim() - 2)))
        return x * mask.to(x.dtype)

    def initial_state(self, pool: torch.Tensor) -> torch.Tensor:
        """State of each sequence from its slot, fp32; zero for a fresh sequence whatever the slot holds."""
        state = pool.index_select(0, self.state_slots).float()
        keep = self.has_prefix.view(-1, *([1] * (state.dim() - 1)))
        return torch.where(keep, state, torch.zeros((), dtype=state.dtype, device=state.device))
