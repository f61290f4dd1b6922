"""The per-draft state sandbox: scratch recurrent-state slots that make a rejected draft roll back exactly.

A verify forward runs D tokens per request (the last accepted token + D - 1 drafts) in one model call. Full
attention writes their K/V at their token slots as usual (rejected ones are simply released). Linear / Mamba
layers cannot be undone that way, so the state after every verify position must exist somewhere.

On models whose recurrent layers write in-forward state checkpoints (all bundled ones), the verify forward is
one ordinary chunked extend: the state after position j (j + 1 tokens, j < D - 1) goes into sandbox slot j of
the request's group as a checkpoint (`ForwardBatch.state_checkpoints`), and the state after all D tokens into
the request's own slot. After acceptance, a request that kept m < D tokens gets sandbox slot m - 1 copied into
its slot; one that kept all D already has its state (no copy). Measured on the demo model (one thread, B = 1
and 4, D = 2 / 4 / 8), this costs less than the fallback below from D = 4 on and about the same at D = 2.

Fallback (a model without in-forward checkpoints): every recurrent mixer is wrapped (`SandboxedMixer`) and
steps the D tokens one by one with its decode path, writing the state after position j into sandbox slot j;
the request's own slot is not touched until the commit copies the kept state into it.

The sandbox slots sit after the state pool's K + 1 slots in the same buffers, sized as SGLang sizes its
intermediate states: (min(max_running_requests, K // slots_per_request) + 1) groups of D slots."""

from __future__ import annotations

import torch
from torch import nn

from runtime.core.batch import PoolBuffers


class StateSandbox:
    def __init__(
        self,
        buffers: PoolBuffers,
        first_slot: int,
        num_groups: int,
        num_draft_tokens: int,
        in_forward: bool = False,
    ) -> None:
        self.buffers = buffers
        self.first_slot = first_slot
        self.num_groups = num_groups
        self.width = num_draft_tokens
        # True: the verify forward writes the states as in-forward checkpoints (the final one in the request's
        # slot); False: the model's mixers are wrapped and step token by token (see the module docstring).
        self.in_forward = in_forward
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

    def activate(self, slots: torch.Tensor) -> None:
        """Route every sandboxed mixer of the model to per-position stepping until `deactivate` (one verify
        forward: the round that planned it deactivates it when it finishes or is abandoned)."""
        self.active = slots

    def deactivate(self) -> None:
        self.active = None

    def checkpoints(self, slots: torch.Tensor) -> list[list[tuple[int, int]]]:
        """`ForwardBatch.state_checkpoints` of an in-forward verify: the state after j + 1 tokens into slot j,
        for every position but the last (whose state the forward writes into the request's own slot)."""
        return [[(j + 1, s) for j, s in enumerate(row[:-1])] for row in slots.tolist()]

    def commit(self, request_slots: list[int], kept_positions: list[int], slots: torch.Tensor) -> None:
        """Copy the state after verify position kept_positions[i] - 1 into request_slots[i], every layer (in
        the in-forward mode only where fewer than D positions were kept: the slot holds the state after D)."""
        rows = [i for i, m in enumerate(kept_positions) if not (self.in_forward and m == self.width)]
        if not rows:
            return
        src = slots[rows, [kept_positions[i] - 1 for i in rows]]
        dst = torch.tensor([request_slots[i] for i in rows], dtype=torch.int64)
        for pool in (*self.buffers.conv, *self.buffers.ssm):
            pool[dst] = pool[src.to(pool.device)]
        self.commits += len(rows)


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

    # torch types Module.__getattr__ as `Tensor | Module` (its parameters, buffers, submodules); this one also
    # forwards the mixer's plain attributes (ints for state shapes), so its return type is wider than torch's.
    def __getattr__(self, name: str) -> object:  # type: ignore[override]
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
