"""Kimi-Linear: Kimi Delta Attention (per-channel gated delta rule) layers with multi-head latent attention
(MLA, no positional encoding) every few layers; DeepSeek-style MoE (sigmoid, grouped top-k) after a dense start.

MLA layers cache the compressed latent, not per-head K/V: `buffers.k[j]` holds the normed `kv_lora_rank` latent
and `buffers.v[j]` the shared `qk_rope_head_dim` key part, one "head" per token, as SGLang's MLA pool does. The KDA
conv state uses SGLang's `(kernel-1, channels)` layout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from runtime.models.base import StepContext
from runtime.models.decoder import LINEAR, CosSin, DecoderBody, DecoderLM, HybridLayer, pool_ordinals
from runtime.models.errors import ModelLoadError
from runtime.models.hf_config import HFConfig
from runtime.models.layers.conv import causal_conv1d_decode, causal_conv1d_extend
from runtime.models.layers.delta_rule import l2norm
from runtime.models.layers.derived import Derived, depthwise_taps, neg_exp
from runtime.models.layers.kda import chunk_kda, recurrent_kda_step
from runtime.models.layers.mlp import GatedMLP
from runtime.models.layers.moe import Experts
from runtime.models.layers.norm import RMSNorm
from runtime.models.layers.packing import SequencePacking
from runtime.models.layers.sigmoid_moe import GroupTopKRouter


@dataclass(frozen=True)
class KimiLinearConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_types: tuple[str, ...]
    mlp_layer_types: tuple[str, ...]
    rms_norm_eps: float
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    linear_num_heads: int
    linear_head_dim: int
    linear_conv_kernel_dim: int
    num_experts: int
    num_experts_per_token: int
    moe_intermediate_size: int
    num_shared_experts: int
    num_expert_group: int
    topk_group: int
    moe_renormalize: bool
    routed_scaling_factor: float
    tie_word_embeddings: bool
    attention_bias: bool

    @classmethod
    def from_hf(cls, cfg: HFConfig) -> KimiLinearConfig:
        layers = cfg.int("num_hidden_layers")
        linear = cfg.data.get("linear_attn_config") or {}
        types = cfg.data.get("layer_types")
        if types is None and "full_attn_layers" in linear and "kda_layers" in linear:
            by_index = {i - 1: "full_attention" for i in linear["full_attn_layers"]}  # 1-based in the checkpoint
            by_index.update({i - 1: "linear_attention" for i in linear["kda_layers"]})
            types = [by_index.get(i) for i in range(layers)]
        if types is None:
            types = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(layers)]
        if cfg.data.get("mla_use_nope") is False:
            raise ModelLoadError(
                f"{cfg.path}: 'mla_use_nope' is false; the bundled runtime implements Kimi-Linear's MLA without "
                "positional encoding only. Serve this model with SGLang."
            )
        mlp_types = cfg.data.get("mlp_layer_types")
        if mlp_types is None:
            dense = cfg.int("first_k_dense_replace", 1)
            mlp_types = ["dense" if i < dense else "sparse" for i in range(layers)]
        if len(types) != layers or set(types) - {"full_attention", "linear_attention"} or len(mlp_types) != layers:
            raise ModelLoadError(
                f"{cfg.path}: 'layer_types' / 'linear_attn_config' and 'mlp_layer_types' must cover all {layers} "
                "layers with full_attention / linear_attention and dense / sparse; fix the file."
            )

        def pick(*keys: str, default: object = None) -> Any:
            for key in keys:
                if cfg.data.get(key) is not None:
                    return cfg.data[key]
            if default is None:
                return cfg.get(keys[0])  # raises the missing-key error for the canonical name
            return default

        return cls(
            vocab_size=cfg.int("vocab_size"),
            hidden_size=cfg.int("hidden_size"),
            intermediate_size=cfg.int("intermediate_size"),
            layer_types=tuple(types),
            mlp_layer_types=tuple(mlp_types),
            rms_norm_eps=cfg.float("rms_norm_eps", 1e-5),
            num_attention_heads=cfg.int("num_attention_heads"),
            q_lora_rank=cfg.data.get("q_lora_rank"),
            kv_lora_rank=cfg.int("kv_lora_rank"),
            qk_nope_head_dim=cfg.int("qk_nope_head_dim"),
            qk_rope_head_dim=cfg.int("qk_rope_head_dim"),
            v_head_dim=cfg.int("v_head_dim"),
            linear_num_heads=int(pick("linear_num_heads", default=linear.get("num_heads"))),
            linear_head_dim=int(pick("linear_head_dim", default=linear.get("head_dim"))),
            linear_conv_kernel_dim=int(pick("linear_conv_kernel_dim", default=linear.get("short_conv_kernel_size", 4))),
            num_experts=int(pick("num_experts", "num_local_experts", default=0)),
            num_experts_per_token=int(pick("num_experts_per_token", "num_experts_per_tok", default=1)),
            moe_intermediate_size=cfg.int("moe_intermediate_size", 0),
            num_shared_experts=int(pick("num_shared_experts", "n_shared_experts", default=1)),
            num_expert_group=int(pick("num_expert_group", "n_group", default=1)),
            topk_group=cfg.int("topk_group", 1),
            moe_renormalize=bool(pick("moe_renormalize", "norm_topk_prob", default=True)),
            routed_scaling_factor=cfg.float("routed_scaling_factor", 1.0),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False)),
        )


class KimiDeltaAttention(nn.Module):
    writes_state_checkpoints = True  # honours ForwardBatch.state_checkpoints (layers/state_checkpoints.py)
    writes_traced_state_checkpoints = True  # and StateCheckpoints.traced, inside a compiled extend
    fp32_parameters = ("A_log", "dt_bias")  # kept fp32 under 16-bit weights (HybridModel.cast)

    def __init__(self, c: KimiLinearConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = c.linear_num_heads, c.linear_head_dim
        dim = self.heads * self.head_dim
        self.dim = dim
        self.q_proj = nn.Linear(c.hidden_size, dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, dim, bias=False)
        # The checkpoint's q_conv1d / k_conv1d / v_conv1d, stacked (see checkpoint_sources).
        self.conv1d = nn.Conv1d(3 * dim, 3 * dim, c.linear_conv_kernel_dim, groups=3 * dim, bias=False)
        self.f_a_proj = nn.Linear(c.hidden_size, self.head_dim, bias=False)
        self.f_b_proj = nn.Linear(self.head_dim, dim, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(dim))
        self.A_log = nn.Parameter(torch.zeros(1, 1, self.heads, 1))
        self._taps, self._decay_rate = Derived(depthwise_taps), Derived(neg_exp)  # parameter-only, kept
        self.b_proj = nn.Linear(c.hidden_size, self.heads, bias=False)
        self.g_a_proj = nn.Linear(c.hidden_size, self.head_dim, bias=False)
        self.g_b_proj = nn.Linear(self.head_dim, dim, bias=False)
        self.o_norm = RMSNorm(self.head_dim, c.rms_norm_eps)
        self.o_proj = nn.Linear(dim, c.hidden_size, bias=False)

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv1d.kernel_size[0] - 1, 3 * self.dim)  # SGLang's layout for Kimi-Linear

    @property
    def ssm_state_shape(self) -> tuple[int, int, int]:
        return (self.heads, self.head_dim, self.head_dim)

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
        mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        weight = self._taps(self.conv1d.weight)
        conv_view = conv_pool.transpose(-1, -2)  # [slots, channels, kernel-1] view of the pool's layout
        shape = (tokens, self.heads, self.head_dim)
        forget = self.f_b_proj(self.f_a_proj(x)).float() + self.dt_bias.float()
        g = (self._decay_rate(self.A_log).view(self.heads, 1) * F.softplus(forget.view(shape))).view(shape)
        beta = torch.sigmoid(self.b_proj(x))
        if packing is None:
            mixed = causal_conv1d_decode(mixed, weight, None, conv_view, state_slots)
            qk, v = mixed.split([2 * self.dim, self.dim], dim=-1)
            # q and k normalized as one tensor (the same per-row math, half the ops); index_select/index_copy_
            # for the state rows: the same values as pool[slots] without advanced indexing's setup.
            q, k = l2norm(qk.reshape(tokens, 2 * self.heads, self.head_dim).float()).chunk(2, dim=-2)
            state = ssm_pool.index_select(0, state_slots).float()
            out, state = recurrent_kda_step(q, k, v.reshape(shape), g, beta, state)
            ssm_pool.index_copy_(0, state_slots, state.to(ssm_pool.dtype))
        else:
            mixed = causal_conv1d_extend(mixed, weight, None, conv_view, packing)
            q, k, v = (packing.pad(t.reshape(shape)) for t in mixed.split(self.dim, dim=-1))
            g_pad = packing.zero_padding(packing.pad(g))
            beta_pad = packing.zero_padding(packing.pad(beta))
            captured: list[torch.Tensor] = []
            out, state = chunk_kda(
                l2norm(q.float()),
                l2norm(k.float()),
                v,
                g_pad,
                beta_pad,
                packing.initial_state(ssm_pool),
                checkpoints=packing.checkpoints,
                captured=captured,
            )
            ssm_pool[packing.state_slots] = state.to(ssm_pool.dtype)
            if packing.checkpoints is not None:
                ssm_pool[packing.checkpoints.slots] = torch.stack(captured).to(ssm_pool.dtype)
            out = packing.unpad(out)
        gate = self.g_b_proj(self.g_a_proj(x)).view(shape)
        if self.o_norm.weight.dtype == torch.float32:  # the weight inside rms_norm: the same product, one op less
            h = F.rms_norm(out.float(), (self.head_dim,), self.o_norm.weight, self.o_norm.eps)
        else:
            h = F.rms_norm(out.float(), (self.head_dim,), eps=self.o_norm.eps) * self.o_norm.weight.float()
        h = (h * torch.sigmoid(gate.float())).to(x.dtype)
        return self.o_proj(h.reshape(tokens, self.dim))


class KimiMLA(nn.Module):
    """Multi-head latent attention without positional encoding; caches the latent, expands it per step."""

    def __init__(self, c: KimiLinearConfig) -> None:
        super().__init__()
        self.heads = c.num_attention_heads
        self.nope, self.rope, self.v_dim, self.lora = (
            c.qk_nope_head_dim,
            c.qk_rope_head_dim,
            c.v_head_dim,
            c.kv_lora_rank,
        )
        qk = self.nope + self.rope
        self.scale = qk**-0.5
        if c.q_lora_rank is None:
            self.q_proj = nn.Linear(c.hidden_size, self.heads * qk, bias=False)
        else:
            self.q_a_proj = nn.Linear(c.hidden_size, c.q_lora_rank, bias=c.attention_bias)
            self.q_a_layernorm = RMSNorm(c.q_lora_rank, 1e-6, weight_in_fp32=False)
            self.q_b_proj = nn.Linear(c.q_lora_rank, self.heads * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(c.hidden_size, self.lora + self.rope, bias=c.attention_bias)
        self.kv_a_layernorm = RMSNorm(self.lora, 1e-6, weight_in_fp32=False)
        self.kv_b_proj = nn.Linear(self.lora, self.heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.heads * self.v_dim, c.hidden_size, bias=c.attention_bias)

    def _expand(self, latent: torch.Tensor, k_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """latent [..., L, lora], k_rot [..., L, rope] → keys [..., H, L, nope+rope], values [..., H, L, v]."""
        kv = self.kv_b_proj(latent).view(*latent.shape[:-1], self.heads, self.nope + self.v_dim)
        k_nope, values = kv.split([self.nope, self.v_dim], dim=-1)
        keys = torch.cat([k_nope, k_rot[..., None, :].expand(*k_rot.shape[:-1], self.heads, self.rope)], dim=-1)
        return keys.transpose(-2, -3), values.transpose(-2, -3)

    def forward(self, x: torch.Tensor, cos_sin: CosSin, ctx: StepContext, ordinal: int) -> torch.Tensor:
        """The attention-mixer call (see HybridLayer.attend); `cos_sin` is None: MLA here has no RoPE."""
        tokens = x.shape[0]
        if hasattr(self, "q_proj"):
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(tokens, self.heads, self.nope + self.rope)
        latent, k_rot = self.kv_a_proj_with_mqa(x).split([self.lora, self.rope], dim=-1)
        latent = self.kv_a_layernorm(latent)
        k_cache, v_cache = ctx.buffers.k[ordinal], ctx.buffers.v[ordinal]
        meta = ctx.attn
        k_cache[ctx.out_locs] = meta.rows_to_write(latent)[:, None, :].to(k_cache.dtype)
        v_cache[ctx.out_locs] = meta.rows_to_write(k_rot)[:, None, :].to(v_cache.dtype)
        if meta.decode:
            assert meta.kv_index is not None
            keys, values = self._expand(
                k_cache[meta.kv_index][:, :, 0].to(x.dtype), v_cache[meta.kv_index][:, :, 0].to(x.dtype)
            )
            out = F.scaled_dot_product_attention(
                q[:, :, None, :], keys, values, attn_mask=meta.kv_mask, scale=self.scale
            )
            out = out.reshape(tokens, -1)
        else:
            assert meta.seq_kv is not None and meta.q_spans is not None and meta.seq_masks is not None
            outs = []
            for slots, (start, length), mask in zip(meta.seq_kv, meta.q_spans, meta.seq_masks, strict=True):
                keys, values = self._expand(k_cache[slots][:, 0].to(x.dtype), v_cache[slots][:, 0].to(x.dtype))
                qs = q[start : start + length].transpose(0, 1)
                o = F.scaled_dot_product_attention(
                    qs, keys, values, attn_mask=mask, is_causal=mask is None, scale=self.scale
                )
                outs.append(o.transpose(0, 1).reshape(length, -1))
            out = torch.cat(outs) if len(outs) > 1 else outs[0]
        return self.o_proj(out)


class KimiSparseMoE(nn.Module):
    def __init__(self, c: KimiLinearConfig) -> None:
        super().__init__()
        self.gate = GroupTopKRouter(
            c.hidden_size,
            c.num_experts,
            c.num_experts_per_token,
            c.num_expert_group,
            c.topk_group,
            c.moe_renormalize,
            c.routed_scaling_factor,
        )
        self.experts = Experts(c.num_experts, c.hidden_size, c.moe_intermediate_size)
        self.shared_experts = GatedMLP(c.hidden_size, c.moe_intermediate_size * c.num_shared_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        return self.experts(x, ids, weights) + self.shared_experts(x)


class KimiDecoderLayer(HybridLayer):
    def __init__(self, c: KimiLinearConfig, layer: int, ordinal: int) -> None:
        super().__init__(c.layer_types[layer], ordinal)
        self.self_attn: nn.Module = KimiDeltaAttention(c) if self.kind == LINEAR else KimiMLA(c)
        self.block_sparse_moe: nn.Module = (
            KimiSparseMoE(c) if c.mlp_layer_types[layer] == "sparse" else GatedMLP(c.hidden_size, c.intermediate_size)
        )
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, weight_in_fp32=False)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, weight_in_fp32=False)

    def forward(self, x: torch.Tensor, cos_sin: CosSin, ctx: StepContext) -> torch.Tensor:
        x = x + self.mix(self.self_attn, self.input_layernorm(x), cos_sin, ctx)
        return x + self.block_sparse_moe(self.post_attention_layernorm(x))


class KimiLinearForCausalLM(DecoderLM):
    def __init__(self, config: KimiLinearConfig) -> None:
        c = config
        ordinals = pool_ordinals(c.layer_types)
        body = DecoderBody(
            nn.Embedding(c.vocab_size, c.hidden_size),
            [KimiDecoderLayer(c, i, ordinals[i]) for i in range(len(c.layer_types))],
            RMSNorm(c.hidden_size, c.rms_norm_eps, weight_in_fp32=False),
        )
        super().__init__(
            config,
            body,
            layer_types=c.layer_types,
            kv_shape=(1, c.kv_lora_rank, c.qk_rope_head_dim),  # MLA: one latent and one shared rope key per token
            hidden_size=c.hidden_size,
            vocab_size=c.vocab_size,
        )
        self.config: KimiLinearConfig = config

    def checkpoint_sources(self) -> dict[str, list[str]]:
        sources: dict[str, list[str]] = {}
        for i, layer in enumerate(self.body.layers):
            p = f"model.layers.{i}"
            if layer.kind == "linear_attention":
                sources[f"{p}.self_attn.conv1d.weight"] = [f"{p}.self_attn.{n}_conv1d.weight" for n in "qkv"]
            if isinstance(layer.block_sparse_moe, KimiSparseMoE):
                e = range(self.config.num_experts)
                m = f"{p}.block_sparse_moe.experts"
                sources[f"{m}.gate_up_proj"] = [f"{m}.{j}.{w}.weight" for j in e for w in ("w1", "w3")]
                sources[f"{m}.down_proj"] = [f"{m}.{j}.w2.weight" for j in e]
        return sources
