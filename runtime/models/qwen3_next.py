"""Qwen3-Next (and Qwen3.5, the same network with unfused DeltaNet projections): 3 gated-DeltaNet layers per
gated full-attention layer; sparse MoE with a shared expert, or a dense SwiGLU MLP."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from runtime.core.batch import ModelLayout
from runtime.models.base import HybridModel, StepContext
from runtime.models.hf_config import HFConfig
from runtime.models.layers.attention import paged_attention
from runtime.models.layers.gated_deltanet import GatedDeltaNet
from runtime.models.layers.mlp import GatedMLP
from runtime.models.layers.moe import SparseMoE
from runtime.models.layers.norm import ZeroCenteredRMSNorm
from runtime.models.layers.rotary import RotaryEmbedding


@dataclass(frozen=True)
class Qwen3NextConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    attention_bias: bool
    layer_types: tuple[str, ...]
    linear_conv_kernel_dim: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool
    decoder_sparse_step: int
    mlp_only_layers: tuple[int, ...]
    tie_word_embeddings: bool
    max_position_embeddings: int
    split_projections: bool = False  # Qwen3.5

    @classmethod
    def from_hf(cls, cfg: HFConfig, *, split_projections: bool = False) -> Qwen3NextConfig:
        layers = cfg.int("num_hidden_layers")
        layer_types = cfg.get("layer_types", None)
        if layer_types is None:
            interval = cfg.int("full_attention_interval", 4)
            layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
        bad = sorted(set(layer_types) - {"full_attention", "linear_attention"})
        if len(layer_types) != layers or bad:
            from runtime.models.errors import ModelLoadError

            raise ModelLoadError(
                f"{cfg.path}: 'layer_types' must list {layers} entries of full_attention / linear_attention "
                f"(got {len(layer_types)}, unknown {bad}); fix the file."
            )
        heads = cfg.int("num_attention_heads")
        theta, partial = cfg.rope(default_partial=0.25)
        return cls(
            vocab_size=cfg.int("vocab_size"),
            hidden_size=cfg.int("hidden_size"),
            intermediate_size=cfg.int("intermediate_size", 0),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=cfg.int("num_key_value_heads"),
            head_dim=cfg.int("head_dim", cfg.int("hidden_size") // heads),
            rms_norm_eps=cfg.float("rms_norm_eps", 1e-6),
            rope_theta=theta,
            partial_rotary_factor=partial,
            attention_bias=bool(cfg.get("attention_bias", False)),
            layer_types=tuple(layer_types),
            linear_conv_kernel_dim=cfg.int("linear_conv_kernel_dim", 4),
            linear_key_head_dim=cfg.int("linear_key_head_dim"),
            linear_value_head_dim=cfg.int("linear_value_head_dim"),
            linear_num_key_heads=cfg.int("linear_num_key_heads"),
            linear_num_value_heads=cfg.int("linear_num_value_heads"),
            num_experts=cfg.int("num_experts", 0),
            num_experts_per_tok=cfg.int("num_experts_per_tok", 1),
            moe_intermediate_size=cfg.int("moe_intermediate_size", 0),
            shared_expert_intermediate_size=cfg.int("shared_expert_intermediate_size", 0),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
            decoder_sparse_step=cfg.int("decoder_sparse_step", 1),
            mlp_only_layers=tuple(cfg.get("mlp_only_layers", None) or ()),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=cfg.int("max_position_embeddings", 32768),
            split_projections=split_projections,
        )

    def is_moe_layer(self, layer: int) -> bool:
        return (
            layer not in self.mlp_only_layers and self.num_experts > 0 and (layer + 1) % self.decoder_sparse_step == 0
        )


class Qwen3NextAttention(nn.Module):
    """Full attention with an output gate (q_proj emits query and gate per head), q/k norm, partial RoPE."""

    def __init__(self, c: Qwen3NextConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        )
        self.q_proj = nn.Linear(c.hidden_size, self.num_heads * self.head_dim * 2, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, self.num_kv_heads * self.head_dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, self.num_kv_heads * self.head_dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, c.hidden_size, bias=c.attention_bias)
        self.q_norm = ZeroCenteredRMSNorm(self.head_dim, c.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(self.head_dim, c.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], ctx: StepContext, ordinal: int
    ) -> torch.Tensor:
        tokens = x.shape[0]
        q, gate = torch.chunk(self.q_proj(x).view(tokens, self.num_heads, 2 * self.head_dim), 2, dim=-1)
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        cos, sin = cos_sin
        q, k = RotaryEmbedding.apply(q, cos, sin), RotaryEmbedding.apply(k, cos, sin)
        out = paged_attention(
            q,
            k,
            v,
            ctx.buffers.k[ordinal],
            ctx.buffers.v[ordinal],
            ctx.out_locs,
            ctx.attn,
            self.head_dim**-0.5,
        )
        out = out.reshape(tokens, -1) * torch.sigmoid(gate.reshape(tokens, -1))
        return self.o_proj(out)


class Qwen3NextDecoderLayer(nn.Module):
    def __init__(self, c: Qwen3NextConfig, layer: int, ordinal: int) -> None:
        super().__init__()
        self.kind = c.layer_types[layer]
        self.ordinal = ordinal  # index among layers of the same kind = index into that kind's pool buffers
        if self.kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(
                c.hidden_size,
                c.linear_num_key_heads,
                c.linear_num_value_heads,
                c.linear_key_head_dim,
                c.linear_value_head_dim,
                c.linear_conv_kernel_dim,
                c.rms_norm_eps,
                split_projections=c.split_projections,
            )
        else:
            self.self_attn = Qwen3NextAttention(c)
        self.mlp: nn.Module
        if c.is_moe_layer(layer):
            self.mlp = SparseMoE(
                c.hidden_size,
                c.num_experts,
                c.num_experts_per_tok,
                c.moe_intermediate_size,
                c.shared_expert_intermediate_size,
                c.norm_topk_prob,
            )
        else:
            self.mlp = GatedMLP(c.hidden_size, c.intermediate_size)
        self.input_layernorm = ZeroCenteredRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], ctx: StepContext) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.kind == "linear_attention":
            h = self.linear_attn(
                h, ctx.buffers.conv[self.ordinal], ctx.buffers.ssm[self.ordinal], ctx.packing, ctx.state_slots
            )
        else:
            h = self.self_attn(h, cos_sin, ctx, self.ordinal)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3NextBody(nn.Module):
    def __init__(self, c: Qwen3NextConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        ordinals = {"linear_attention": 0, "full_attention": 0}
        layers = []
        for i, kind in enumerate(c.layer_types):
            layers.append(Qwen3NextDecoderLayer(c, i, ordinals[kind]))
            ordinals[kind] += 1
        self.layers = nn.ModuleList(layers)
        self.norm = ZeroCenteredRMSNorm(c.hidden_size, c.rms_norm_eps)


class Qwen3NextForCausalLM(HybridModel):
    def __init__(self, config: Qwen3NextConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Qwen3NextBody(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        rotary_dim = int(config.head_dim * config.partial_rotary_factor)
        self.rotary = RotaryEmbedding(config.head_dim, rotary_dim, config.rope_theta)

    def layout(self) -> ModelLayout:
        c = self.config
        attn = tuple(i for i, t in enumerate(c.layer_types) if t == "full_attention")
        linear = tuple(i for i, t in enumerate(c.layer_types) if t == "linear_attention")
        # State shapes come from the mixer itself: one definition for allocation and for use.
        mixer = next(layer.linear_attn for layer in self.model.layers if layer.kind == "linear_attention")
        return ModelLayout(
            num_layers=c.num_hidden_layers,
            attn_layer_ids=attn,
            linear_layer_ids=linear,
            num_kv_heads=c.num_key_value_heads,
            head_dim=c.head_dim,
            v_head_dim=c.head_dim,
            conv_state_shape=mixer.conv_state_shape,
            ssm_state_shape=mixer.ssm_state_shape,
            vocab_size=c.vocab_size,
        )

    def checkpoint_sources(self) -> dict[str, list[str]]:
        sources: dict[str, list[str]] = {}
        for i in range(self.config.num_hidden_layers):
            if self.config.is_moe_layer(i):
                sources.update(SparseMoE.checkpoint_sources(f"model.layers.{i}.mlp", self.config.num_experts))
        return sources

    def extra_weight_prefixes(self) -> tuple[str, ...]:
        return ("mtp.",)

    def checkpoint_prefix_renames(self) -> dict[str, str]:
        # Qwen3.5's multimodal checkpoints nest the language model one level down.
        return {"model.language_model.": "model."} if self.config.split_projections else {}

    def ignored_weight_prefixes(self) -> tuple[str, ...]:
        # The vision tower of a multimodal checkpoint: the runtime serves text only.
        return ("model.visual.", "visual.") if self.config.split_projections else ()

    def forward_tokens(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        cos_sin = self.rotary.cos_sin(ctx.positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos_sin, ctx)
        x = ctx.logit_rows(x)
        return self.lm_head(self.model.norm(x)).float()
