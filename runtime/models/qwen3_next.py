"""Qwen3-Next (and Qwen3.5, the same network with unfused DeltaNet projections): 3 gated-DeltaNet layers per
gated full-attention layer; sparse MoE with a shared expert, or a dense SwiGLU MLP."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from runtime.models.base import StepContext
from runtime.models.decoder import (
    FULL,
    LINEAR,
    CosSin,
    DecoderBody,
    DecoderLM,
    HybridLayer,
    checked_layer_types,
    pool_ordinals,
)
from runtime.models.hf_config import HFConfig
from runtime.models.layers.gated_deltanet import GatedDeltaNet
from runtime.models.layers.mlp import GatedMLP
from runtime.models.layers.moe import SparseMoE
from runtime.models.layers.norm import ZeroCenteredRMSNorm
from runtime.models.layers.rotary import RotaryEmbedding
from runtime.models.layers.rotary_attention import AttentionOptions, RotaryAttention


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
        layer_types = checked_layer_types(cfg, "layer_types", layer_types, (FULL, LINEAR), count=layers)
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
            layer_types=layer_types,
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


class Qwen3NextDecoderLayer(HybridLayer):
    def __init__(self, c: Qwen3NextConfig, layer: int, ordinal: int) -> None:
        super().__init__(c.layer_types[layer], ordinal)
        if self.kind == LINEAR:
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
            # Gated full attention: q_proj emits query and gate per head; zero-centred q/k norm; partial RoPE.
            self.self_attn = RotaryAttention(
                AttentionOptions(
                    c.hidden_size,
                    c.num_attention_heads,
                    c.num_key_value_heads,
                    c.head_dim,
                    bias=c.attention_bias,
                    qk_norm=lambda dim: ZeroCenteredRMSNorm(dim, c.rms_norm_eps),
                    output_gate=True,
                )
            )
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

    def forward(self, x: torch.Tensor, cos_sin: CosSin, ctx: StepContext) -> torch.Tensor:
        mixer = self.linear_attn if self.kind == LINEAR else self.self_attn
        short = ctx.packing is not None and ctx.packing.host is not None  # a short extend: C kernels where they fit
        if ctx.packing is not None and not short and x.device.type == "cpu":  # a long extend: add and norm in C
            _, h = self.input_layernorm.add_and_norm(x, None, long_extend=True)
            x, h = self.post_attention_layernorm.add_and_norm(x, self.mix(mixer, h, cos_sin, ctx), long_extend=True)
        else:
            x = x + self.mix(mixer, self.input_layernorm(x, short_extend=short), cos_sin, ctx)
            h = self.post_attention_layernorm(x, short_extend=short)
        return x + (self.mlp(h, short_extend=short) if isinstance(self.mlp, SparseMoE) else self.mlp(h))


class Qwen3NextForCausalLM(DecoderLM):
    def __init__(self, config: Qwen3NextConfig) -> None:
        c = config
        ordinals = pool_ordinals(c.layer_types)
        body = DecoderBody(
            nn.Embedding(c.vocab_size, c.hidden_size),
            [Qwen3NextDecoderLayer(c, i, ordinals[i]) for i in range(len(c.layer_types))],
            ZeroCenteredRMSNorm(c.hidden_size, c.rms_norm_eps),
        )
        super().__init__(
            config,
            body,
            layer_types=c.layer_types,
            kv_shape=(c.num_key_value_heads, c.head_dim, c.head_dim),
            hidden_size=c.hidden_size,
            vocab_size=c.vocab_size,
            rotary=RotaryEmbedding(c.head_dim, int(c.head_dim * c.partial_rotary_factor), c.rope_theta),
        )
        self.config: Qwen3NextConfig = config

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
