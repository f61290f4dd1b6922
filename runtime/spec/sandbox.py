"""The per-draft state sandbox: scratch recurrent-state slots that make a rejected draft roll back exactly.

A verify forward runs D tokens per request (the last accepted token + D - 1 drafts) in one model call. Full
attention writes their K/V at their token slots as usual (rejected ones are simply released). Linear / Mamba
layers cannot be undone that way, so during a verify forward each of them steps token by token: the state
after draft position j goes into sandbox slot j of the request's group, and the request's own slot is not
touched. After acceptance, the state after the last kept position is copied into the request's slot; the rest
of the group is scratch for the next round. Stepping a token at a time is the decode path itself, so a
verified token sees the same state arithmetic as a plainly decoded one.

The sandbox slots sit after the state pool's K + 1 slots in the same buffers, sized as SGLang sizes its
intermediate states: (min(max_running_requests, K // slots_per_request) + 1) groups of D slots."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from runtime.engine.forward_batch import PoolBuffers


class StateSandbox:
    def __init__(self, buffers: PoolBuffers, first_slot: int, num_groups: int, num_draft_tokens: int) -> None:
        self.buffers = buffers
        self.first_slot = first_slot
        self.num_groups = num_groups
        self.width = num_draft_tokens
        self.active: torch.Tensor | None = None  # [B, D] sandbox slots of the verify forward in flight
        self.commits = 0

    @property
    def num_slots(self) -> int:
        return self.num_groups * self.width

    def slots_for(self, batch_size: int) -> torch.Tensor:
        """[B, D] slots: group i for the i-th request of the verify batch (groups live for one round only)."""
        if batch_size > self.num_groups:
            raise RuntimeError(
                f"verify batch of {batch_size} requests exceeds the {self.num_groups} sandbox groups; the "
                f"running-request cap must not exceed the groups the pool was sized for"
            )
        base = self.first_slot + torch.arange(batch_size)[:, None] * self.width
        return base + torch.arange(self.width)[None, :]

    @contextmanager
    def verifying(self, slots: torch.Tensor) -> Iterator[None]:
        """Route every sandboxed mixer of the model to per-position stepping for one forward."""
        self.active = slots
        try:
            yield
        finally:
            self.active = None

    def commit(self, request_slots: list[int], kept_positions: list[int], slots: torch.Tensor) -> None:
        """Copy the state after verify position kept_positions[i] - 1 into request_slots[i], every layer."""
        if not request_slots:
            return
        rows = torch.arange(len(request_slots))
        src = slots[rows, torch.tensor(kept_positions) - 1]
        dst = torch.tensor(request_slots, dtype=torch.int64)
        for pool in (*self.buffers.conv, *self.buffers.ssm):
            pool[dst] = pool[src.to(pool.device)]
        self.commits += len(request_slots)


class SandboxedMixer(nn.Module):
    """Wraps a linear-attention / Mamba mixer `(x, conv_pool, ssm_pool, packing, state_slots) -> out`.

    Outside a verify forward it is the mixer itself. Inside one, the packed [B * D, hidden] input is run as D
    decode steps; step j reads the state after position j - 1 (the request's own slot for j = 0) and writes
    the state after position j into sandbox slot j.
    """

    def __init__(self, inner: nn.Module, sandbox: StateSandbox) -> None:
        super().__init__()
        self.inner = inner
        self._sandbox = [sandbox]  # a list keeps it out of nn.Module's attribute registry

    def __getattr__(self, name: str) -> object:
        # The model reads the mixer's own attributes (state shapes for its layout): answer as the mixer.
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["inner"], name)

    def forward(
        self,
        x: torch.Tensor,
        conv_pool: torch.Tensor,
        ssm_pool: torch.Tensor,
        packing: object,
        state_slots: torch.Tensor,
    ) -> torch.Tensor:
        slots = self._sandbox[0].active
        if slots is None:
            return self.inner(x, conv_pool, ssm_pool, packing, state_slots)
        batch, width = slots.shape
        slots = slots.to(x.device)
        steps = x.view(batch, width, -1)
        outs = []
        for j in range(width):
            src = state_slots if j == 0 else slots[:, j - 1]
            dst = slots[:, j]
            conv_pool[dst] = conv_pool[src]
            ssm_pool[dst] = ssm_pool[src]
            outs.append(self.inner(steps[:, j].contiguous(), conv_pool, ssm_pool, None, dst))
        return torch.stack(outs, dim=1).reshape(batch * width, -1)


def install_sandbox(model: nn.Module, sandbox: StateSandbox) -> int:
    """Wrap every recurrent mixer of the model (the modules the layers call with the state pools). Returns how
    many were wrapped; the model's weights and behaviour outside verify forwards are unchanged."""
    from runtime.models.layers.gated_deltanet import GatedDeltaNet
    from runtime.models.layers.mamba2 import Mamba2Mixer

    wrapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, GatedDeltaNet | Mamba2Mixer):
                setattr(module, name, SandboxedMixer(child, sandbox))
                wrapped += 1
    return wrapped
