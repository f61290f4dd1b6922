"""Mamba2 mixer (Nemotron-H, Granite-4.0-H, Falcon-H1): in_proj → causal conv → selective scan → gated
norm → out_proj. Falcon-H1 adds muP multipliers on the input and on each section of the projection, and its
own choice of output gating."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from runtime.models.layers.conv import causal_conv1d_decode
from runtime.models.layers.derived import Derived, depthwise_taps, neg_exp
from runtime.models.layers.mamba2_extend import gated_norm, mamba2_conv_extend
from runtime.models.layers.norm import FalconGatedRMSNorm, GroupedGatedRMSNorm
from runtime.models.layers.packing import SequencePacking
from runtime.models.layers.ssd import chunk_scan, recurrent_step
from runtime.models.layers.state_checkpoints import write_states

GatedNorm = Literal["mamba2", "norm_then_gate", "gate_then_norm", "gate_only"]


class Mamba2Mixer(nn.Module):
    writes_state_checkpoints = True  # honours ForwardBatch.state_checkpoints (see state_checkpoints.py)
    writes_traced_state_checkpoints = True  # and StateCheckpoints.traced, inside a compiled extend
    fp32_parameters = ("A_log", "dt_bias", "D")  # kept fp32 under 16-bit weights (HybridModel.cast)

    def __init__(
        self,
        hidden: int,
        num_heads: int,
        head_dim: int,
        state_size: int,
        n_groups: int,
        conv_kernel: int,
        chunk_size: int,
        dt_limit: tuple[float, float],
        eps: float,
        use_bias: bool,
        use_conv_bias: bool,
        *,
        out_bias: bool | None = None,
        in_multiplier: float = 1.0,
        proj_multipliers: tuple[float, ...] | None = None,
        gated_norm: GatedNorm = "mamba2",
    ) -> None:
        """`gated_norm`: "mamba2" gates then RMS-normalizes per group (Nemotron-H, Granite); Falcon-H1 either
        normalizes then gates, gates then normalizes (its `mamba_rms_norm`), or only gates ("gate_only").
        `proj_multipliers`: Falcon-H1's `ssm_multipliers` for the gate, x, B, C and dt sections of in_proj."""
        super().__init__()
        self.num_heads, self.head_dim, self.state_size, self.n_groups = (
            num_heads,
            head_dim,
            state_size,
            n_groups,
        )
        self.intermediate = num_heads * head_dim
        self.conv_dim = self.intermediate + 2 * n_groups * state_size
        self.chunk_size = chunk_size
        # transformers clamps dt to the limit in prefill only; we clamp in decode too so the two paths agree.
        self.dt_min, self.dt_max = dt_limit
        self.in_proj = nn.Linear(hidden, self.intermediate + self.conv_dim + num_heads, bias=use_bias)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv_kernel, groups=self.conv_dim, bias=use_conv_bias)
        self.dt_bias = nn.Parameter(torch.ones(num_heads))
        self.A_log = nn.Parameter(torch.zeros(num_heads))
        self._taps, self._decay_rate = Derived(depthwise_taps), Derived(neg_exp)  # parameter-only, kept
        self.D = nn.Parameter(torch.ones(num_heads))
        self.gated_norm = gated_norm
        self.norm: nn.Module | None
        if gated_norm == "mamba2":
            self.norm = GroupedGatedRMSNorm(self.intermediate, eps, self.intermediate // n_groups)
        elif gated_norm == "gate_only":
            self.norm = None
        else:
            self.norm = FalconGatedRMSNorm(self.intermediate, eps, n_groups, gated_norm == "norm_then_gate")
        self.out_proj = nn.Linear(self.intermediate, hidden, bias=use_bias if out_bias is None else out_bias)
        self.in_multiplier = in_multiplier
        self.proj_multipliers = proj_multipliers
        self._mup: torch.Tensor | None = None  # built lazily: models are created on the meta device

    def _mup_vector(self, like: torch.Tensor) -> torch.Tensor:
        if self._mup is None or self._mup.device != like.device or self._mup.dtype != like.dtype:
            assert self.proj_multipliers is not None
            gs = self.n_groups * self.state_size
            sizes = (self.intermediate, self.intermediate, gs, gs, self.num_heads)
            parts = [torch.full((n,), m) for n, m in zip(sizes, self.proj_multipliers, strict=True)]
            self._mup = torch.cat(parts).to(device=like.device, dtype=like.dtype)
        return self._mup

    def decay_rate(self) -> torch.Tensor:
        """`-exp(A_log)` fp32 [heads], kept between calls and remade when A_log changes."""
        return self._decay_rate(self.A_log)

    def conv_taps(self) -> torch.Tensor:
        """The depthwise conv weight as [conv_dim, kernel] (a view)."""
        return self._taps(self.conv1d.weight)

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv_dim, self.conv1d.kernel_size[0] - 1)

    @property
    def ssm_state_shape(self) -> tuple[int, int, int]:
        return (self.num_heads, self.head_dim, self.state_size)

    def forward(
        self,
        x: torch.Tensor,
        conv_pool: torch.Tensor,
        ssm_pool: torch.Tensor,
        packing: SequencePacking | None,
        state_slots: torch.Tensor,
    ) -> torch.Tensor:
        """x: [T, hidden]. `packing` is None in decode mode (one token per sequence, T == B)."""
        tokens = x.shape[0]
        projected = self.in_proj(x * self.in_multiplier if self.in_multiplier != 1.0 else x)
        if self.proj_multipliers is not None:
            projected = projected * self._mup_vector(projected)
        gate, xbc, dt = projected.split([self.intermediate, self.conv_dim, self.num_heads], dim=-1)
        weight = self._taps(self.conv1d.weight)
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(min=self.dt_min, max=self.dt_max)
        a = self._decay_rate(self.A_log)
        groups_n = self.n_groups * self.state_size
        if packing is None:
            xbc = causal_conv1d_decode(xbc, weight, self.conv1d.bias, conv_pool, state_slots)
            xs, b, c = xbc.split([self.intermediate, groups_n, groups_n], dim=-1)
            y, state = recurrent_step(
                xs.view(tokens, self.num_heads, self.head_dim),
                dt,
                a,
                b.view(tokens, self.n_groups, self.state_size),
                c.view(tokens, self.n_groups, self.state_size),
                self.D,
                ssm_pool.index_select(0, state_slots).float(),
            )
            ssm_pool.index_copy_(0, state_slots, state.to(ssm_pool.dtype))  # cheaper than pool[slots] = ...
        else:
            xbc = mamba2_conv_extend(xbc, weight, self.conv1d.bias, conv_pool, packing)
            xs, b, c = (packing.pad(t) for t in xbc.split([self.intermediate, groups_n, groups_n], dim=-1))
            batch, length = xs.shape[:2]
            captured: list[torch.Tensor] = []
            # Rounded to the activations' dtype inside the scan where the gated norm takes it so anyway.
            y_dtype = x.dtype if self.gated_norm == "mamba2" else torch.float32
            y, state = chunk_scan(
                xs.view(batch, length, self.num_heads, self.head_dim),
                packing.zero_padding(packing.pad(dt)),  # dt = 0: padded steps neither decay nor write the state
                a,
                b.view(batch, length, self.n_groups, self.state_size),
                c.view(batch, length, self.n_groups, self.state_size),
                self.D,
                packing.initial_state(ssm_pool),
                self.chunk_size,
                checkpoints=packing.checkpoints,
                captured=captured,
                out_dtype=y_dtype,
            )
            ssm_pool[packing.state_slots] = state.to(ssm_pool.dtype)
            if packing.checkpoints is not None:
                write_states(ssm_pool, packing.checkpoints.slots, captured)
            y = packing.unpad(y)
        y = y.reshape(tokens, self.intermediate)
        if self.norm is None:
            y = y * F.silu(gate.float())
        elif isinstance(self.norm, GroupedGatedRMSNorm):
            y = gated_norm(self.norm, y.to(x.dtype), gate)
        else:
            y = self.norm(y, gate)
        return self.out_proj(y.to(x.dtype))
