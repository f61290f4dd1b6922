"""Qwen3-Next's gated DeltaNet token mixer (linear attention with a conv front end and a delta-rule state)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.core.device_path import accelerator_path
from runtime.models.layers.conv import causal_conv1d_decode, causal_conv1d_extend
from runtime.models.layers.delta_rule import chunk_gated_delta_rule, l2norm, recurrent_gated_delta_step
from runtime.models.layers.derived import Derived, depthwise_taps, neg_exp
from runtime.models.layers.fla_kernels import fla_decode_step
from runtime.models.layers.norm import GatedRMSNorm
from runtime.models.layers.packing import SequencePacking
from runtime.models.layers.state_checkpoints import write_states
from runtime.native import extend_kernels


class GatedDeltaNet(nn.Module):
    """`split_projections=False`: Qwen3-Next's fused, per-key-head-interleaved `in_proj_qkvz` / `in_proj_ba`.
    `split_projections=True`: Qwen3.5's separate `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`."""

    writes_state_checkpoints = True  # honours ForwardBatch.state_checkpoints (see state_checkpoints.py)
    writes_traced_state_checkpoints = True  # and StateCheckpoints.traced, inside a compiled extend
    fp32_parameters = ("A_log", "dt_bias")  # kept fp32 under 16-bit weights (HybridModel.cast)
    # Long extends through the chunked C kernel (`_long_extend`); False: the torch chunked form, which tests hold
    # it to (tests/runtime/test_short_extend_kernels.py's reference path).
    native_long_extend = True

    def __init__(
        self,
        hidden: int,
        num_k_heads: int,
        num_v_heads: int,
        k_head_dim: int,
        v_head_dim: int,
        conv_kernel: int,
        eps: float,
        split_projections: bool = False,
    ) -> None:
        super().__init__()
        self.num_k_heads, self.num_v_heads = num_k_heads, num_v_heads
        self.k_head_dim, self.v_head_dim = k_head_dim, v_head_dim
        self.key_dim = num_k_heads * k_head_dim
        self.value_dim = num_v_heads * v_head_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv_kernel, groups=self.conv_dim, bias=False)
        self.split_projections = split_projections
        if split_projections:
            self.in_proj_qkv = nn.Linear(hidden, self.conv_dim, bias=False)
            self.in_proj_z = nn.Linear(hidden, self.value_dim, bias=False)
            self.in_proj_b = nn.Linear(hidden, num_v_heads, bias=False)
            self.in_proj_a = nn.Linear(hidden, num_v_heads, bias=False)
        else:
            self.in_proj_qkvz = nn.Linear(hidden, 2 * self.key_dim + 2 * self.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(hidden, 2 * num_v_heads, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(num_v_heads))
        self.norm = GatedRMSNorm(v_head_dim, eps)
        self.out_proj = nn.Linear(self.value_dim, hidden, bias=False)
        self._taps, self._decay_rate = Derived(depthwise_taps), Derived(neg_exp)  # parameter-only, kept
        self._orders: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._rows_deinterleaved = False  # set by after_weights_loaded: the column gather is in the weights

    @torch.no_grad()
    def after_weights_loaded(self) -> None:
        """Reorder the fused projections' rows once, at load, so they emit [q | k | v | z] and [b | a] directly:
        the per-forward column gather it replaces was 6 ms of a 2048-token prefill (peer model, 2 threads). The
        same dot products in another order: every output element keeps its bits."""
        if self.split_projections or self._rows_deinterleaved:
            return
        qkvz_order, ba_order = self._deinterleave_orders(self.in_proj_qkvz.weight.device)
        self.in_proj_qkvz.weight.copy_(self.in_proj_qkvz.weight.index_select(0, qkvz_order))
        self.in_proj_ba.weight.copy_(self.in_proj_ba.weight.index_select(0, ba_order))
        self._rows_deinterleaved = True
        if not accelerator_path(self.in_proj_qkvz.weight.device):  # the C kernels read host memory
            extend_kernels.library()  # built (or its absence logged) at load, not inside the first request

    def decode_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The projection weights as row blocks (qkv [conv_dim, H], z [value_dim, H], b [nv, H], a [nv, H]),
        views of the parameters, for a decode kernel outside torch (runtime/engine/native_decode.py); None while
        the fused rows are still per-key-head interleaved (before `after_weights_loaded`)."""
        if self.split_projections:
            return self.in_proj_qkv.weight, self.in_proj_z.weight, self.in_proj_b.weight, self.in_proj_a.weight
        if not self._rows_deinterleaved:
            return None
        qkvz, ba = self.in_proj_qkvz.weight, self.in_proj_ba.weight
        nv = self.num_v_heads
        return qkvz[: self.conv_dim], qkvz[self.conv_dim :], ba[:nv], ba[nv:]

    def decay_rate(self) -> torch.Tensor:
        """`-exp(A_log)` fp32 [nv], kept between calls and remade when A_log changes."""
        return self._decay_rate(self.A_log)

    def conv_taps(self) -> torch.Tensor:
        """The depthwise conv weight as [conv_dim, kernel] (a view)."""
        return self._taps(self.conv1d.weight)

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv_dim, self.conv1d.kernel_size[0] - 1)

    @property
    def ssm_state_shape(self) -> tuple[int, int, int]:
        # [heads, v_dim, k_dim]: SGLang's (and FLA's) layout, so both engines size and move state alike.
        return (self.num_v_heads, self.v_head_dim, self.k_head_dim)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(mixed q|k|v [T, conv_dim], z [T, nv, dv], b [T, nv], a [T, nv])."""
        tokens = x.shape[0]
        if self.split_projections:
            z = self.in_proj_z(x).view(tokens, self.num_v_heads, self.v_head_dim)
            return self.in_proj_qkv(x), z, self.in_proj_b(x), self.in_proj_a(x)
        # Qwen3-Next interleaves q, k, v, z (and b, a) per key-head group; one column gather undoes that grouping
        # (the 3 reshape copies + cat it replaces were ~10 ops per layer per step).
        qkvz, ba = self.in_proj_qkvz(x), self.in_proj_ba(x)
        if not self._rows_deinterleaved:
            qkvz_order, ba_order = self._deinterleave_orders(x.device)
            qkvz, ba = qkvz.index_select(-1, qkvz_order), ba.index_select(-1, ba_order)
        mixed, z = torch.split(qkvz, [self.conv_dim, self.value_dim], dim=-1)
        b, a = torch.split(ba, [self.num_v_heads, self.num_v_heads], dim=-1)
        return mixed, z.reshape(tokens, self.num_v_heads, self.v_head_dim), b, a

    def _deinterleave_orders(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Column orders mapping the fused projections' per-key-head-group layout to [q | k | v | z] and
        [b | a]. They depend only on the shapes, so they are built once per device."""
        cached = self._orders.get(device)
        if cached is None:
            ratio = self.num_v_heads // self.num_k_heads
            sizes = [self.k_head_dim, self.k_head_dim, ratio * self.v_head_dim, ratio * self.v_head_dim]
            qkvz = torch.arange(self.num_k_heads * sum(sizes)).view(self.num_k_heads, -1).split(sizes, dim=-1)
            ba = torch.arange(2 * self.num_v_heads).view(self.num_k_heads, 2 * ratio).split([ratio, ratio], dim=-1)
            cached = (
                torch.cat([part.reshape(-1) for part in qkvz]).to(device),
                torch.cat([part.reshape(-1) for part in ba]).to(device),
            )
            self._orders[device] = cached
        return cached

    def _split_heads(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lead = mixed.shape[:-1]
        qk, v = torch.split(mixed, [2 * self.key_dim, self.value_dim], dim=-1)
        # q and k normalized (and head-expanded) as one tensor: the same per-row math, half the ops.
        qk = l2norm(qk.reshape(*lead, 2 * self.num_k_heads, self.k_head_dim).float())
        ratio = self.num_v_heads // self.num_k_heads
        if ratio > 1:
            qk = qk.repeat_interleave(ratio, dim=-2)
        q, k = qk.chunk(2, dim=-2)
        return q, k, v.reshape(*lead, self.num_v_heads, self.v_head_dim)

    def forward(
        self,
        x: torch.Tensor,
        conv_pool: torch.Tensor,
        ssm_pool: torch.Tensor,
        packing: SequencePacking | None,
        state_slots: torch.Tensor,
    ) -> torch.Tensor:
        """x: [T, hidden]. `packing` is None in decode mode (one token per sequence, T == B)."""
        mixed, z, b, a = self._project(x)
        weight = self._taps(self.conv1d.weight)
        if packing is not None and not torch.compiler.is_compiling():
            plan = packing.short_extend_plan()
            if plan is not None:
                out = self._short_extend(plan, mixed, z, b, a, weight, conv_pool, ssm_pool)
                if out is not None:
                    return self.out_proj(out)
            elif self.native_long_extend and not accelerator_path(x.device):
                out = self._long_extend(packing, mixed, z, b, a, weight, conv_pool, ssm_pool)
                if out is not None:
                    return self.out_proj(out.to(x.dtype))
        beta = b.sigmoid()
        g = self._decay_rate(self.A_log) * F.softplus(a.float() + self.dt_bias)
        if packing is None:
            mixed = causal_conv1d_decode(mixed, weight, self.conv1d.bias, conv_pool, state_slots)
            q, k, v = self._split_heads(mixed)
            state = ssm_pool.index_select(0, state_slots).float()
            fused = fla_decode_step(q, k, v, g, beta, state)  # fla's kernel on CUDA where installed
            out, state = fused if fused is not None else recurrent_gated_delta_step(q, k, v, g, beta, state)
            ssm_pool.index_copy_(0, state_slots, state.to(ssm_pool.dtype))
        else:
            mixed = causal_conv1d_extend(mixed, weight, self.conv1d.bias, conv_pool, packing)
            q, k, v = (packing.pad(t) for t in self._split_heads(mixed))
            g, beta = packing.zero_padding(packing.pad(g)), packing.zero_padding(packing.pad(beta))
            initial = packing.initial_state(ssm_pool).transpose(-1, -2)
            captured: list[torch.Tensor] = []
            out, state = chunk_gated_delta_rule(
                q, k, v, g, beta, initial, checkpoints=packing.checkpoints, captured=captured
            )
            ssm_pool[packing.state_slots] = state.transpose(-1, -2).to(ssm_pool.dtype)
            if packing.checkpoints is not None:
                write_states(ssm_pool, packing.checkpoints.slots, captured, transpose=True)
            out = packing.unpad(out)
        out = self.norm(out.to(x.dtype), z)
        return self.out_proj(out.reshape(x.shape[0], self.value_dim))

    def _long_extend(
        self,
        packing: SequencePacking,
        mixed: torch.Tensor,
        z: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        weight: torch.Tensor,
        conv_pool: torch.Tensor,
        ssm_pool: torch.Tensor,
    ) -> torch.Tensor | None:
        """A long extend (a cold prefill, a long prompt after a cached prefix): the short-extend kernel's contract
        with the delta rule chunked in C (runtime/native/gdn_chunked.c), each value head's chunk in cache. The torch
        chunked form was ~20 full-size fp32 intermediates a layer through memory (real-size Qwen3-Next, 2048 tokens:
        ~0.9 s of delta rule per prefill). Its fp32 sums go in another order than the torch form's, agreeing to fp32
        rounding (tests/runtime/test_long_extend_kernel.py), as the torch form agrees with transformers' own. None
        when the kernel cannot take the batch (the torch path then)."""
        ck = packing.checkpoints
        if ck is not None and ck.traced_tokens is not None:
            return None
        try:
            plan = extend_kernels.ShortExtendPlan.build(
                packing.lens.tolist(),
                [bool(p) for p in packing.has_prefix.tolist()],
                packing.state_slots.tolist(),
                list(ck.seq) if ck else [],
                list(ck.tokens) if ck else [],
                ck.slots.tolist() if ck else [],
            )
        except extend_kernels.NativeRefused:
            return None
        # mixed and z go in as they are (the kernel widens 16-bit rows as it reads them); b and a are a few columns.
        return self._short_extend(
            plan, mixed, z, b.float(), a.float(), weight.float(), conv_pool, ssm_pool, chunked=True
        )

    def _short_extend(
        self,
        plan: extend_kernels.ShortExtendPlan,
        mixed: torch.Tensor,
        z: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        weight: torch.Tensor,
        conv_pool: torch.Tensor,
        ssm_pool: torch.Tensor,
        *,
        chunked: bool = False,
    ) -> torch.Tensor | None:
        """A few new tokens: conv, gates, delta rule, checkpoints and gated norm in one C call (the same math as
        the chunked path, token by token; tests/runtime/test_short_extend_kernels.py holds them together).
        [T, value_dim] before out_proj, or None when the kernel cannot take these tensors (the torch path).
        `chunked`: the delta rule by chunks (`_long_extend`)."""
        try:
            return extend_kernels.gdn_short_extend(
                plan,
                mixed,
                z.reshape(z.shape[0], self.value_dim),
                b,
                a,
                weight,
                None if self.conv1d.bias is None else self.conv1d.bias.float(),
                conv_pool,
                ssm_pool,
                self._decay_rate(self.A_log),
                self.dt_bias,
                self.norm.weight.float(),
                self.norm.eps,
                (self.num_k_heads, self.num_v_heads, self.k_head_dim, self.v_head_dim),
                chunked=chunked,
            )
        except extend_kernels.NativeRefused:
            return None
