"""Nemotron-H: a stack of single-mixer blocks — Mamba2, attention (no RoPE), squared-ReLU MLP or MoE —
chosen per layer by `layers_block_type` (or the older `hybrid_override_pattern` string)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from runtime.core.batch import ModelLayout
from runtime.models.base import HybridModel, StepContext
from runtime.models.errors import ModelLoadError
from runtime.models.hf_config import HFConfig
from runtime.models.layers.attention import paged_attention
from runtime.models.layers.mamba2 import Mamba2Mixer
from runtime.models.layers.mlp import Relu2MLP
from runtime.models.layers.norm import RMSNorm
from runtime.models.layers.sigmoid_moe import SigmoidMoE

_PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
_LEGACY_NAMES = {"mamba": "linear_attention", "attention": "full_attention"}


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
        types = cfg.data.get("layers_block_type") or cfg.data.get("layer_types")
        if types is None:
            pattern = cfg.get("hybrid_override_pattern")
            unknown = sorted(set(pattern) - set(_PATTERN))
            if unknown:
                raise ModelLoadError(
                    f"{cfg.path}: 'hybrid_override_pattern' has unknown characters {unknown}; use "
                    "M (Mamba2), * (attention), - (MLP) and E (MoE)."
                )
            types = [_PATTERN[ch] for ch in pattern]
        types = [_LEGACY_NAMES.get(t, t) for t in types]
        unknown = sorted(set(types) - set(_PATTERN.values()))
        if unknown:
            raise ModelLoadError(
                f"{cfg.path}: 'layers_block_type' has unknown entries {unknown}; use linear_attention, "
                "full_attention, mlp and moe."
            )
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


class NemotronHAttention(nn.Module):
    """Plain GQA attention; Nemotron-H uses no positional encoding (the Mamba layers carry position)."""

    def __init__(self, c: NemotronHConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        )
        self.q_proj = nn.Linear(c.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, ctx: StepContext, ordinal: int) -> torch.Tensor:
        tokens = x.shape[0]
        q = self.q_proj(x).view(tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
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
        return self.o_proj(out.reshape(tokens, -1))


class NemotronHBlock(nn.Module):
    def __init__(self, c: NemotronHConfig, kind: str, ordinal: int) -> None:
        super().__init__()
        self.kind = kind
        self.ordinal = ordinal  # index among layers with the same cache kind
        self.norm = RMSNorm(c.hidden_size, c.layer_norm_epsilon)
        self.mixer: nn.Module
        if kind == "linear_attention":
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
        elif kind == "full_attention":
            self.mixer = NemotronHAttention(c)
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

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        h = self.norm(x)
        if self.kind == "linear_attention":
            h = self.mixer(
                h, ctx.buffers.conv[self.ordinal], ctx.buffers.ssm[self.ordinal], ctx.packing, ctx.state_slots
            )
        elif self.kind == "full_attention":
            h = self.mixer(h, ctx, self.ordinal)
        else:
            h = self.mixer(h)
        return x + h


class NemotronHBackbone(nn.Module):
    def __init__(self, c: NemotronHConfig) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        ordinals = {"linear_attention": 0, "full_attention": 0}
        blocks = []
        for kind in c.layer_types:
            blocks.append(NemotronHBlock(c, kind, ordinals.get(kind, -1)))
            if kind in ordinals:
                ordinals[kind] += 1
        self.layers = nn.ModuleList(blocks)
        self.norm_f = RMSNorm(c.hidden_size, c.layer_norm_epsilon)


class NemotronHForCausalLM(HybridModel):
    def __init__(self, config: NemotronHConfig) -> None:
        super().__init__()
        self.config = config
        self.backbone = NemotronHBackbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def layout(self) -> ModelLayout:
        c = self.config
        mixer = next(block.mixer for block in self.backbone.layers if block.kind == "linear_attention")
        return ModelLayout(
            num_layers=len(c.layer_types),
            attn_layer_ids=tuple(i for i, t in enumerate(c.layer_types) if t == "full_attention"),
            linear_layer_ids=tuple(i for i, t in enumerate(c.layer_types) if t == "linear_attention"),
            num_kv_heads=c.num_key_value_heads,
            head_dim=c.head_dim,
            v_head_dim=c.head_dim,
            conv_state_shape=mixer.conv_state_shape,
            ssm_state_shape=mixer.ssm_state_shape,
            vocab_size=c.vocab_size,
        )

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

    def forward_tokens(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.backbone.embeddings(input_ids)
        for block in self.backbone.layers:
            x = block(x, ctx)
        x = ctx.logit_rows(x)
        return self.lm_head(self.backbone.norm_f(x)).float()
