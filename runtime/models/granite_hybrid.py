"""Granite-4.0-H (`granitemoehybrid`): Mamba2 or attention per layer, each followed by a top-k MoE plus a
shared SwiGLU MLP, with Granite's muP multipliers on embeddings, residuals, attention scores and logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from runtime.core.device_path import on_accelerator_path
from runtime.models.base import StepContext
from runtime.models.decoder import (
    FULL,
    LAYER_ALIASES,
    LINEAR,
    CosSin,
    DecoderBody,
    DecoderLM,
    HybridLayer,
    checked_layer_types,
    pool_ordinals,
)
from runtime.models.errors import ModelLoadError
from runtime.models.hf_config import HFConfig
from runtime.models.layers.derived import Derived, per_expert
from runtime.models.layers.grouped_moe import grouped_experts
from runtime.models.layers.mamba2 import Mamba2Mixer
from runtime.models.layers.moe import one_token_experts, swiglu, traced_experts
from runtime.models.layers.norm import RMSNorm
from runtime.models.layers.rotary import RotaryEmbedding
from runtime.models.layers.rotary_attention import AttentionOptions, RotaryAttention


@dataclass(frozen=True)
class GraniteHybridConfig:
    vocab_size: int
    hidden_size: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    attention_bias: bool
    rms_norm_eps: float
    use_rope: bool
    rope_theta: float
    embedding_multiplier: float
    residual_multiplier: float
    attention_multiplier: float
    logits_scaling: float
    num_local_experts: int
    num_experts_per_tok: int
    intermediate_size: int
    shared_intermediate_size: int
    mamba_n_heads: int
    mamba_d_head: int
    mamba_d_state: int
    mamba_n_groups: int
    mamba_d_conv: int
    mamba_chunk_size: int
    mamba_conv_bias: bool
    mamba_proj_bias: bool
    dt_limit: tuple[float, float]
    tie_word_embeddings: bool

    @classmethod
    def from_hf(cls, cfg: HFConfig) -> GraniteHybridConfig:
        layers = cfg.int("num_hidden_layers")
        key = "layer_types" if cfg.data.get("layer_types") else "layers_block_type"
        raw = cfg.data.get(key) or [LINEAR] * layers
        layer_types = checked_layer_types(cfg, key, raw, (LINEAR, FULL), count=layers, aliases=LAYER_ALIASES)
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ModelLoadError(
                f"{cfg.path}: 'hidden_act' is '{act}'; the bundled runtime implements Granite-4.0-H with "
                "silu only. Serve this model with SGLang."
            )
        hidden, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
        mamba_heads = cfg.int("mamba_n_heads", 128)
        d_head = cfg.data.get("mamba_d_head", "auto")
        if d_head in (None, "auto"):
            d_head = cfg.int("mamba_expand", 2) * hidden // mamba_heads
        theta, _ = cfg.rope()
        return cls(
            vocab_size=cfg.int("vocab_size"),
            hidden_size=hidden,
            layer_types=layer_types,
            num_attention_heads=heads,
            num_key_value_heads=cfg.int("num_key_value_heads", None) or heads,
            head_dim=cfg.int("head_dim", hidden // heads),
            attention_bias=bool(cfg.get("attention_bias", False)),
            rms_norm_eps=cfg.float("rms_norm_eps", 1e-6),
            use_rope=cfg.data.get("position_embedding_type") == "rope",
            rope_theta=theta,
            embedding_multiplier=cfg.float("embedding_multiplier", 1.0),
            residual_multiplier=cfg.float("residual_multiplier", 1.0),
            attention_multiplier=cfg.float("attention_multiplier", 1.0),
            logits_scaling=cfg.float("logits_scaling", 1.0),
            num_local_experts=cfg.int("num_local_experts", 0),
            num_experts_per_tok=cfg.int("num_experts_per_tok", 1),
            intermediate_size=cfg.int("intermediate_size", 0),
            shared_intermediate_size=cfg.int("shared_intermediate_size"),
            mamba_n_heads=mamba_heads,
            mamba_d_head=int(d_head),
            mamba_d_state=cfg.int("mamba_d_state", 256),
            mamba_n_groups=cfg.int("mamba_n_groups", 1),
            mamba_d_conv=cfg.int("mamba_d_conv", 4),
            mamba_chunk_size=cfg.int("mamba_chunk_size", 256),
            mamba_conv_bias=bool(cfg.get("mamba_conv_bias", True)),
            mamba_proj_bias=bool(cfg.get("mamba_proj_bias", False)),
            dt_limit=cfg.float_pair("time_step_limit", (0.0, float("inf"))),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )


class _Stacked(nn.Module):
    """Holds one [experts, out, in] weight under the checkpoint's name (`input_linear.weight`, ...)."""

    def __init__(self, experts: int, out_dim: int, in_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, out_dim, in_dim))


class _Router(nn.Module):
    def __init__(self, hidden: int, experts: int) -> None:
        super().__init__()
        self.layer = nn.Linear(hidden, experts, bias=False)


class GraniteMoE(nn.Module):
    """Top-k over router logits, softmax over the chosen k; SwiGLU experts (gate and up halves stacked)."""

    def __init__(self, hidden: int, experts: int, top_k: int, intermediate: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.num_experts = experts
        self.router = _Router(hidden, experts)
        self.input_linear = _Stacked(experts, 2 * intermediate, hidden)
        self.output_linear = _Stacked(experts, hidden, intermediate)
        self._per_expert_in, self._per_expert_out = Derived(per_expert), Derived(per_expert)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router.layer(x).float()
        top, ids = logits.topk(self.top_k, dim=-1)
        weights = torch.softmax(top, dim=-1).type_as(x)
        if torch.compiler.is_compiling():  # the compiled decode path: no host sync
            return traced_experts(x, ids, weights, self.input_linear.weight, self.output_linear.weight, swiglu)
        if on_accelerator_path(x):  # no host read of the routing (runtime/models/layers/grouped_moe.py)
            return grouped_experts(x, ids, weights, self.input_linear.weight, self.output_linear.weight, swiglu)
        if x.shape[0] == 1:
            w_in, w_out = self._per_expert_in(self.input_linear.weight), self._per_expert_out(self.output_linear.weight)
            return one_token_experts(x, ids, weights, w_in, w_out, swiglu)
        out = torch.zeros_like(x)
        order = torch.argsort(ids.reshape(-1), stable=True)
        counts = torch.bincount(ids.reshape(-1), minlength=self.num_experts).tolist()
        token_of = order // self.top_k
        w_sorted = weights.reshape(-1)[order]
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            tokens = token_of[start : start + count]
            gate, up = F.linear(x[tokens], self.input_linear.weight[expert]).chunk(2, dim=-1)
            h = F.linear(F.silu(gate) * up, self.output_linear.weight[expert])
            out.index_add_(0, tokens, h * w_sorted[start : start + count, None])
            start += count
        return out


class SharedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.input_linear = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.output_linear = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.input_linear(x).chunk(2, dim=-1)
        return self.output_linear(F.silu(gate) * up)


class GraniteDecoderLayer(HybridLayer):
    def __init__(self, c: GraniteHybridConfig, kind: str, ordinal: int) -> None:
        super().__init__(kind, ordinal)
        self.residual_multiplier = c.residual_multiplier
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, weight_in_fp32=False)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, weight_in_fp32=False)
        if kind == LINEAR:
            self.mamba = Mamba2Mixer(
                c.hidden_size,
                c.mamba_n_heads,
                c.mamba_d_head,
                c.mamba_d_state,
                c.mamba_n_groups,
                c.mamba_d_conv,
                c.mamba_chunk_size,
                c.dt_limit,
                c.rms_norm_eps,
                c.mamba_proj_bias,
                c.mamba_conv_bias,
            )
        else:
            # Granite replaces 1/sqrt(head_dim) with a tuned multiplier.
            self.self_attn = RotaryAttention(
                AttentionOptions(
                    c.hidden_size,
                    c.num_attention_heads,
                    c.num_key_value_heads,
                    c.head_dim,
                    bias=c.attention_bias,
                    scale=c.attention_multiplier,
                )
            )
        self.block_sparse_moe = (
            GraniteMoE(c.hidden_size, c.num_local_experts, c.num_experts_per_tok, c.intermediate_size)
            if c.num_local_experts > 0
            else None
        )
        self.shared_mlp = SharedMLP(c.hidden_size, c.shared_intermediate_size)

    def forward(self, x: torch.Tensor, cos_sin: CosSin, ctx: StepContext) -> torch.Tensor:
        mixer = self.mamba if self.kind == LINEAR else self.self_attn
        x = x + self.mix(mixer, self.input_layernorm(x), cos_sin, ctx) * self.residual_multiplier
        h = self.post_attention_layernorm(x)
        out = self.shared_mlp(h)
        if self.block_sparse_moe is not None:
            out = self.block_sparse_moe(h) + out
        return x + out * self.residual_multiplier


class GraniteHybridForCausalLM(DecoderLM):
    def __init__(self, config: GraniteHybridConfig) -> None:
        c = config
        ordinals = pool_ordinals(c.layer_types)
        body = DecoderBody(
            nn.Embedding(c.vocab_size, c.hidden_size),
            [GraniteDecoderLayer(c, kind, ordinals[i]) for i, kind in enumerate(c.layer_types)],
            RMSNorm(c.hidden_size, c.rms_norm_eps, weight_in_fp32=False),
        )
        super().__init__(
            config,
            body,
            layer_types=c.layer_types,
            kv_shape=(c.num_key_value_heads, c.head_dim, c.head_dim),
            hidden_size=c.hidden_size,
            vocab_size=c.vocab_size,
            rotary=RotaryEmbedding(c.head_dim, c.head_dim, c.rope_theta) if c.use_rope else None,
            embedding_multiplier=c.embedding_multiplier,
        )
        self.config: GraniteHybridConfig = config

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / self.config.logits_scaling
