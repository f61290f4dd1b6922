"""Mamba2 mixer (Nemotron-H): in_proj → causal conv → selective scan → gated group norm → out_proj."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.models.layers.conv import causal_conv1d_decode, causal_conv1d_extend
from runtime.models.layers.norm import GroupedGatedRMSNorm
from runtime.models.layers.packing import SequencePacking
from runtime.models.layers.ssd import chunk_scan, recurrent_step


class Mamba2Mixer(nn.Module):
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
    ) -> None:
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
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, conv_kernel, groups=self.conv_dim, bias=use_conv_bias
        )
        self.dt_bias = nn.Parameter(torch.ones(num_heads))
        self.A_log = nn.Parameter(torch.zeros(num_heads))
        self.D = nn.Parameter(torch.ones(num_heads))
        self.norm = GroupedGatedRMSNorm(self.intermediate, eps, self.intermediate // n_groups)
        self.out_proj = nn.Linear(self.intermediate, hidden, bias=use_bias)

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
        gate, xbc, dt = self.in_proj(x).split([self.intermediate, self.conv_dim, self.num_heads], dim=-1)
        weight = self.conv1d.weight[:, 0, :]
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(min=self.dt_min, max=self.dt_max)
        a = -torch.exp(self.A_log.float())
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
                ssm_pool[state_slots].float(),
            )
            ssm_pool[state_slots] = state.to(ssm_pool.dtype)
        else:
            xbc = causal_conv1d_extend(xbc, weight, self.conv1d.bias, conv_pool, packing)
            xs, b, c = (packing.pad(t) for t in xbc.split([self.intermediate, groups_n, groups_n], dim=-1))
            batch, length = xs.shape[:2]
            y, state = chunk_scan(
                xs.view(batch, length, self.num_heads, self.head_dim),
                packing.zero_padding(
                    packing.pad(dt)
                ),  # dt = 0: padded steps neither decay nor write the state
                a,
                b.view(batch, length, self.n_groups, self.state_size),
                c.view(batch, length, self.n_groups, self.state_size),
                self.D,
                packing.initial_state(ssm_pool),
                self.chunk_size,
            )
            ssm_pool[packing.state_slots] = state.to(ssm_pool.dtype)
            y = packing.unpad(y)
        y = self.norm(y.reshape(tokens, self.intermediate).to(x.dtype), gate)
        return self.out_proj(y)
