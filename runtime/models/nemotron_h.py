"""Nemotron-H: a stack of single-mixer blocks — Mamba2, attention (no RoPE), squared-ReLU MLP or MoE —
chosen per layer by `layers_block_type` (or the older `hybrid_override_pattern` string)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

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
from runtime.models.layers.mamba2 import Mamba2Mixer
from runtime.models.layers.mlp import Relu2MLP
from runtime.models.layers.norm import RMSNorm
from runtime.models.layers.rotary_attention import AttentionOptions, RotaryAttention
from runtime.models.layers.sigmoid_moe import SigmoidMoE

_PATTERN = {"M": LINEAR, "E": "moe", "*": FULL, "-": "mlp"}


@dataclass(frozen=True)
class NemotronHConfig:
    vocab_size: int
    hidden_size: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    mlp_bias: bool
    layer_norm_epsilon: float
    mamba_num_heads: int
    mamba_head_dim: int
    ssm_state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int
    time_step_min: float
    use_bias: bool
    use_conv_bias: bool
    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    moe_shared_expert_intermediate_size: int
    moe_latent_size: int | None
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    tie_word_embeddings: bool

    @classmethod
    def from_hf(cls, cfg: HFConfig) -> NemotronHConfig:
        key = "layers_block_type" if cfg.data.get("layers_block_type") else "layer_types"
        types = cfg.data.get(key)
        if types is None:
            pattern = cfg.get("hybrid_override_pattern")
            unknown = sorted(set(pattern) - set(_PATTERN))
            if unknown:
                raise ModelLoadError(
                    f"{cfg.path}: 'hybrid_override_pattern' has unknown characters {unknown}; use "
                    "M (Mamba2), * (attention), - (MLP) and E (MoE)."
                )
            types = [_PATTERN[ch] for ch in pattern]
        types = checked_layer_types(cfg, key, types, tuple(_PATTERN.values()), aliases=LAYER_ALIASES)
        act = cfg.get("mlp_hidden_act", "relu2")
        if act != "relu2":
            raise ModelLoadError(
                f"{cfg.path}: 'mlp_hidden_act' is '{act}'; the bundled runtime implements Nemotron-H with "
                "relu2 only. Serve this model with SGLang."
            )
        heads = cfg.int("num_attention_heads")
        hidden = cfg.int("hidden_size")
        head_dim = cfg.data.get("head_dim") or cfg.data.get("attention_head_dim") or hidden // heads
        return cls(
            vocab_size=cfg.int("vocab_size"),
            hidden_size=hidden,
            layer_types=tuple(types),
            num_attention_heads=heads,
            num_key_value_heads=cfg.int("num_key_value_heads", None) or heads,
            head_dim=int(head_dim),
            intermediate_size=cfg.int("intermediate_size", 0),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            layer_norm_epsilon=cfg.float("layer_norm_epsilon", 1e-5),
            mamba_num_heads=cfg.int("mamba_num_heads"),
            mamba_head_dim=cfg.int("mamba_head_dim"),
            ssm_state_size=cfg.int("ssm_state_size"),
            n_groups=cfg.int("n_groups", cfg.data.get("mamba_n_groups", 1)),
            conv_kernel=cfg.int("conv_kernel", cfg.data.get("mamba_d_conv", 4)),
            chunk_size=cfg.int("chunk_size", cfg.data.get("mamba_chunk_size", 128)),
            time_step_min=cfg.float("time_step_min", cfg.data.get("mamba_dt_min", 0.001)),
            use_bias=bool(cfg.get("use_bias", False)),
            use_conv_bias=bool(cfg.get("use_conv_bias", cfg.data.get("mamba_conv_bias", True))),
            n_routed_experts=cfg.int("n_routed_experts", 0),
            num_experts_per_tok=cfg.int("num_experts_per_tok", 1),
            moe_intermediate_size=cfg.int("moe_intermediate_size", 0),
            moe_shared_expert_intermediate_size=cfg.int("moe_shared_expert_intermediate_size", 0),
            moe_latent_size=cfg.data.get("moe_latent_size"),
            n_group=cfg.int("n_group", 1),
            topk_group=cfg.int("topk_group", 1),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
            routed_scaling_factor=cfg.float("routed_scaling_factor", 1.0),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )


class NemotronHBlock(HybridLayer):
    def __init__(self, c: NemotronHConfig, kind: str, ordinal: int) -> None:
        super().__init__(kind, ordinal)
        self.norm = RMSNorm(c.hidden_size, c.layer_norm_epsilon)
        self.mixer: nn.Module
        if kind == LINEAR:
            self.mixer = Mamba2Mixer(
                c.hidden_size,
                c.mamba_num_heads,
                c.mamba_head_dim,
                c.ssm_state_size,
                c.n_groups,
                c.conv_kernel,
                c.chunk_size,
                (c.time_step_min, float("inf")),
                c.layer_norm_epsilon,
                c.use_bias,
                c.use_conv_bias,
            )
        elif kind == FULL:
            # Plain GQA attention; Nemotron-H uses no positional encoding (the Mamba layers carry position).
            self.mixer = RotaryAttention(
                AttentionOptions(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim)
            )
        elif kind == "mlp":
            self.mixer = Relu2MLP(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        else:
            self.mixer = SigmoidMoE(
                c.hidden_size,
                c.n_routed_experts,
                c.num_experts_per_tok,
                c.moe_intermediate_size,
                c.moe_shared_expert_intermediate_size,
                c.n_group,
                c.topk_group,
                c.norm_topk_prob,
                c.routed_scaling_factor,
                c.moe_latent_size,
                c.mlp_bias,
            )

    def forward(self, x: torch.Tensor, cos_sin: CosSin, ctx: StepContext) -> torch.Tensor:
        return x + self.mix(self.mixer, self.norm(x), cos_sin, ctx)


class NemotronHForCausalLM(DecoderLM):
    body_name = "backbone"

    def __init__(self, config: NemotronHConfig) -> None:
        c = config
        ordinals = pool_ordinals(c.layer_types)
        body = DecoderBody(
            nn.Embedding(c.vocab_size, c.hidden_size),
            [NemotronHBlock(c, kind, ordinals[i]) for i, kind in enumerate(c.layer_types)],
            RMSNorm(c.hidden_size, c.layer_norm_epsilon),
            embed_name="embeddings",
            norm_name="norm_f",
        )
        super().__init__(
            config,
            body,
            layer_types=c.layer_types,
            kv_shape=(c.num_key_value_heads, c.head_dim, c.head_dim),
            hidden_size=c.hidden_size,
            vocab_size=c.vocab_size,
        )
        self.config: NemotronHConfig = config

    def checkpoint_sources(self) -> dict[str, list[str]]:
        sources: dict[str, list[str]] = {}
        for i, kind in enumerate(self.config.layer_types):
            if kind == "moe":
                sources.update(
                    SigmoidMoE.checkpoint_sources(f"backbone.layers.{i}.mixer", self.config.n_routed_experts)
                )
        return sources

    def checkpoint_aliases(self) -> dict[str, str]:
        # transformers renames `backbone.` to `model.` in memory; checkpoints saved from that layout use it.
        aliases = {
            name: "model." + name[len("backbone.") :]
            for name, _ in self.named_parameters()
            if name.startswith("backbone.")
        }
        if self.config.tie_word_embeddings:
            aliases["lm_head.weight"] = "backbone.embeddings.weight"
        return aliases

    def extra_weight_prefixes(self) -> tuple[str, ...]:
        return ("mtp.",)
